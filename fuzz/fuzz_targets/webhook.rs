//! Fuzz target `webhook`: the input and the properties are `planbot::core::fuzzing::webhook`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| planbot::core::fuzzing::webhook(data));
