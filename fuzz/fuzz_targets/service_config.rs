//! Fuzz target `service_config`: the input and the properties are `planbot::core::fuzzing::service_config`.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| planbot::core::fuzzing::service_config(data));
