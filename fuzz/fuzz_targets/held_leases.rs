#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| sluice_fuzz::held_leases(data));
