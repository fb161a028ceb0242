//! Generates the internal RPC services from `proto/` with a pure-Rust protobuf compiler
//! (protox), so building needs no protoc.

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let files = [
        "proto/common.proto",
        "proto/consensus.proto",
        "proto/tserver.proto",
        "proto/master.proto",
    ];
    for file in files {
        println!("cargo:rerun-if-changed={file}");
    }
    let descriptors = protox::compile(files, ["proto"])?;
    // `bytes` fields are `Bytes`: decoding a request slices its buffer instead of copying
    // (write batches, Raft messages, scan results), and a retried call clones a handle.
    tonic_prost_build::configure()
        .bytes(".")
        .compile_fds(descriptors)?;
    Ok(())
}
