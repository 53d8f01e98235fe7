//! Fuzz target `markdown`: the input and the properties are `planbot::core::fuzzing::markdown`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| planbot::core::fuzzing::markdown(data));
