//! Compiles the seed contracts under `proto/` with `protox` (pure Rust, no
//! system `protoc`), generates prost messages plus tonic clients and servers,
//! and writes the encoded descriptor set for tonic-reflection.

use std::path::{Path, PathBuf};

use prost::Message as _;

fn collect_protos(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect_protos(&path, out)?;
        } else if path.extension().is_some_and(|ext| ext == "proto") {
            out.push(path);
        }
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let proto_dir = manifest_dir.join("proto");
    println!("cargo:rerun-if-changed=proto");
    println!("cargo:rerun-if-changed=build.rs");

    let mut files = Vec::new();
    collect_protos(&proto_dir, &mut files)?;
    files.sort();

    let fds = protox::compile(&files, [&proto_dir])?;

    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out_dir.join("paddock_descriptor.bin"), fds.encode_to_vec())?;

    tonic_prost_build::configure()
        // Smaller per-stream buffers than tonic's default (see `Codec` in proto/lib.rs).
        .codec_path("crate::Codec")
        // Proto maps as BTreeMaps: paddock's own maps are BTreeMaps, and a sorted one is
        // built from them in one pass, where a HashMap hashed every key of every listed
        // session (8% of the daemon's CPU answering `session list --all`); entries also go on
        // the wire in one order.
        .btree_map(".")
        // A listed session's environment behind a pointer: it is half of a `SessionInfo`
        // (488 of 960 bytes), and a page of 100 sessions is decoded into a `Vec` that grows
        // by copying (the CLI's `session list --all` touched ~120 more pages than `list`).
        .boxed(".obey.local.v1.SessionInfo.environment_spec")
        .build_server(true)
        .build_client(true)
        .compile_fds(fds)?;

    Ok(())
}
