#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| tensorwire_proto::fuzzing::ptr1_server_session(data));
