//! Fuzz target `defuse`: the input and the properties are `planbot::core::fuzzing::defuse`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| planbot::core::fuzzing::defuse(data));
