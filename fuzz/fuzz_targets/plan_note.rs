//! Fuzz target `plan_note`: the input and the properties are `planbot::core::fuzzing::plan_note`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| planbot::core::fuzzing::plan_note(data));
