#![no_main]
libfuzzer_sys::fuzz_target!(init: sluice_fuzz::host_events_init(), |data: &[u8]| sluice_fuzz::host_events(data));
