#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kiln::fuzzing::run("npm_lock", data));
