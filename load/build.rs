//! Compiles the client of Envoy's rate limit service (the service's own copy of the protos,
//! service/proto) with protox, a protobuf compiler in Rust: no `protoc` binary is needed.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=../service/proto");
    let descriptors = protox::compile(["envoy/service/ratelimit/v3/rls.proto"], ["../service/proto"])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(false)
        .include_file("envoy.rs")
        .compile_fds(descriptors)?;
    Ok(())
}
