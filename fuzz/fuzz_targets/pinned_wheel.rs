#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| kiln::fuzzing::run("pinned_wheel", data));
