#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tensorwire_proto::fuzzing::ptr1_client_session(data));
