//! Fuzz target `repo_config`: the input and the properties are `planbot::core::fuzzing::repo_config`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| planbot::core::fuzzing::repo_config(data));
