//! Compiles the project's .proto files with protox (pure Rust, no protoc) into prost
//! types plus pbjson serde impls (proto3 JSON mapping). `google.protobuf.Timestamp`
//! maps to the crate's own type, whose JSON is RFC 3339 in UTC with a `Z` suffix.

use std::path::PathBuf;

use prost::Message as _;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protos = ["proto/process.proto", "proto/filesystem.proto"];
    for proto in &protos {
        println!("cargo:rerun-if-changed={proto}");
    }
    let descriptors = protox::compile(protos, ["proto"])?;
    let descriptor_bytes = descriptors.encode_to_vec();
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);

    let mut config = prost_build::Config::new();
    config.extern_path(".google.protobuf.Timestamp", "crate::timestamp::Timestamp");
    config.compile_fds(descriptors)?;

    pbjson_build::Builder::new()
        .register_descriptors(&descriptor_bytes)?
        .extern_path(".google.protobuf.Timestamp", "crate::timestamp::Timestamp")
        .out_dir(&out_dir)
        .ignore_unknown_fields()
        .build(&[".process", ".filesystem"])?;
    Ok(())
}
