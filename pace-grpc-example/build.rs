//! Generates the `Greeter` service and its messages from
//! proto/greeter.proto with the `protoc` of protoc-bin-vendored (no system
//! protoc).

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY-free in edition 2021: the build script is single-threaded.
    std::env::set_var("PROTOC", protoc);
    tonic_prost_build::compile_protos("proto/greeter.proto")?;
    println!("cargo:rerun-if-changed=proto/greeter.proto");
    Ok(())
}
