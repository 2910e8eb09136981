//! Every RPC against bad input (issue 15 point 9, the review's test 2 kept in the
//! repository): the methods are read from the compiled descriptor set, so an RPC added later
//! is covered without touching this table. For each method of the daemon's socket (obey, Aria,
//! sunbeam) and of the runner's (centaurx), five requests are built field by field from its
//! descriptor: every field missing; numbers negative and enums unknown; every string 1 MiB;
//! unicode with NUL, RTL override and invalid surrogates' replacement; path traversal. Each
//! must be answered (or, for a stream meant to stay open, keep quiet) within its time with a
//! status that is not a daemon failure (INTERNAL is allowed only as the registry's OBEY-2005),
//! a message no longer than 4 KiB (no input echoed back), and the daemon must still answer.

use std::collections::BTreeMap;
use std::time::Duration;

use prost::Message as _;
use prost_types::field_descriptor_proto::{Label, Type};
use prost_types::{DescriptorProto, FileDescriptorSet};
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::Code;

use crate::harness::*;

/// Bytes in, bytes out: the requests are encoded by hand from the descriptors.
#[derive(Default, Clone)]
struct Raw;

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        use prost::bytes::BufMut;
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        use prost::bytes::Buf;
        let mut v = vec![0; src.remaining()];
        src.copy_to_slice(&mut v);
        Ok(Some(v))
    }
}

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Case {
    Missing,
    Invalid,
    Oversized,
    Unicode,
    Traversal,
}

const CASES: [Case; 5] = [
    Case::Missing,
    Case::Invalid,
    Case::Oversized,
    Case::Unicode,
    Case::Traversal,
];

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn key(field: i32, wire: u64, out: &mut Vec<u8>) {
    varint(((field as u64) << 3) | wire, out);
}

/// A message of type `name` filled for `case` (nested messages to depth 3).
fn encode(msgs: &BTreeMap<String, DescriptorProto>, name: &str, case: Case, depth: u32) -> Vec<u8> {
    let mut out = Vec::new();
    if case == Case::Missing {
        return out;
    }
    let Some(m) = msgs.get(name) else {
        return out;
    };
    let text: Vec<u8> = match case {
        Case::Missing => unreachable!(),
        Case::Invalid => b" ".to_vec(),
        Case::Oversized => vec![b'x'; 1024 * 1024],
        Case::Unicode => "naïve ☃ \u{202e}\u{0}\u{fffd} 𝕏".as_bytes().to_vec(),
        Case::Traversal => b"../../../../../../etc/passwd".to_vec(),
    };
    for f in &m.field {
        let n = f.number();
        let t = f.r#type();
        match t {
            Type::String | Type::Bytes => {
                key(n, 2, &mut out);
                varint(text.len() as u64, &mut out);
                out.extend_from_slice(&text);
            }
            Type::Int32 | Type::Int64 | Type::Uint32 | Type::Uint64 => {
                key(n, 0, &mut out);
                varint(
                    if case == Case::Invalid {
                        u64::MAX
                    } else {
                        1 << 40
                    },
                    &mut out,
                );
            }
            Type::Sint32 | Type::Sint64 => {
                key(n, 0, &mut out);
                varint(1, &mut out); // zigzag: -1
            }
            Type::Enum => {
                key(n, 0, &mut out);
                varint(if case == Case::Invalid { 99 } else { u64::MAX }, &mut out);
            }
            Type::Bool => {
                key(n, 0, &mut out);
                varint(1, &mut out);
            }
            Type::Double => {
                key(n, 1, &mut out);
                out.extend_from_slice(&f64::NAN.to_le_bytes());
            }
            Type::Float => {
                key(n, 5, &mut out);
                out.extend_from_slice(&f32::INFINITY.to_le_bytes());
            }
            Type::Message if depth < 3 => {
                let inner = encode(msgs, f.type_name(), case, depth + 1);
                key(n, 2, &mut out);
                varint(inner.len() as u64, &mut out);
                out.extend_from_slice(&inner);
            }
            _ => {}
        }
        let _ = Label::Repeated; // repeated fields get one element, like the others
    }
    out
}

struct Method {
    path: String,
    input: String,
    client_streaming: bool,
    server_streaming: bool,
}

fn methods() -> (Vec<Method>, BTreeMap<String, DescriptorProto>) {
    let set = FileDescriptorSet::decode(paddock_proto::FILE_DESCRIPTOR_SET).unwrap();
    let mut msgs = BTreeMap::new();
    let mut methods = Vec::new();
    fn add(prefix: &str, m: &DescriptorProto, msgs: &mut BTreeMap<String, DescriptorProto>) {
        let full = format!("{prefix}.{}", m.name());
        for nested in &m.nested_type {
            add(&full, nested, msgs);
        }
        msgs.insert(full, m.clone());
    }
    for file in &set.file {
        let pkg = file.package();
        for m in &file.message_type {
            add(&format!(".{pkg}"), m, &mut msgs);
        }
        for s in &file.service {
            for m in &s.method {
                methods.push(Method {
                    path: format!("/{pkg}.{}/{}", s.name(), m.name()),
                    input: m.input_type().to_string(),
                    client_streaming: m.client_streaming(),
                    server_streaming: m.server_streaming(),
                });
            }
        }
    }
    (methods, msgs)
}

/// What one call came to: its status, or `None` for a stream that stayed open, quiet.
async fn call(socket: &std::path::Path, m: &Method, body: Vec<u8>) -> Option<tonic::Status> {
    let ch = paddock::transport::channel(socket).await.expect("connect");
    let mut grpc = tonic::client::Grpc::new(ch);
    grpc.ready().await.expect("ready");
    let path: tonic::codegen::http::uri::PathAndQuery = m.path.parse().unwrap();
    let first = |r: Result<Option<Vec<u8>>, tonic::Status>| match r {
        Err(e) => Some(e),
        Ok(_) => Some(tonic::Status::ok("")),
    };
    match (m.client_streaming, m.server_streaming) {
        (false, false) => match grpc.unary(tonic::Request::new(body), path, Raw).await {
            Ok(_) => Some(tonic::Status::ok("")),
            Err(e) => Some(e),
        },
        (false, true) => {
            match grpc
                .server_streaming(tonic::Request::new(body), path, Raw)
                .await
            {
                Err(e) => Some(e),
                Ok(s) => {
                    let mut s = s.into_inner();
                    match tokio::time::timeout(Duration::from_millis(500), s.message()).await {
                        Ok(r) => first(r),
                        Err(_) => None,
                    }
                }
            }
        }
        (true, _) => {
            let input = tokio_stream::iter([body]);
            match grpc.streaming(tonic::Request::new(input), path, Raw).await {
                Err(e) => Some(e),
                Ok(s) => {
                    let mut s = s.into_inner();
                    match tokio::time::timeout(Duration::from_millis(500), s.message()).await {
                        Ok(r) => first(r),
                        Err(_) => None,
                    }
                }
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_rpc_refuses_bad_input_cleanly() {
    let mut d = Daemon::start().await;
    d.campaign().await;
    // A live session, so that requests naming sessions meet one that exists too.
    d.session(None).await;
    let runner_socket = d.dirs.data.join("runner.sock");
    let (methods, msgs) = methods();
    let mut tally: BTreeMap<String, usize> = BTreeMap::new();
    let mut calls = 0;
    for m in &methods {
        // Not bad input: these end the daemon or the runner by design.
        if m.path.ends_with("/Shutdown") || m.path.starts_with("/grpc.") {
            continue;
        }
        let socket = if m.path.starts_with("/runner.") {
            &runner_socket
        } else {
            &d.dirs.socket
        };
        for case in CASES {
            let body = encode(&msgs, &m.input, case, 0);
            let what = format!("{} {case:?}", m.path);
            let got = tokio::time::timeout(Duration::from_secs(20), call(socket, m, body))
                .await
                .unwrap_or_else(|_| panic!("{what}: no answer within 20 s"));
            calls += 1;
            let code = got.as_ref().map_or(Code::Ok, |s| s.code());
            *tally.entry(format!("{code:?}")).or_default() += 1;
            if let Some(s) = &got {
                assert!(
                    !matches!(s.code(), Code::Unknown | Code::DataLoss)
                        && (s.code() != Code::Internal || s.message().starts_with("OBEY-2005")),
                    "{what}: a daemon failure: {s:?}"
                );
                assert!(
                    s.message().len() <= 4096,
                    "{what}: a {} byte message",
                    s.message().len()
                );
            }
            // Still there.
            d.client()
                .await
                .ping(paddock_proto::obey::local::v1::PingRequest {})
                .await
                .unwrap_or_else(|e| panic!("after {what}, ping: {e:?}"));
        }
    }
    eprintln!(
        "bad input: {calls} calls over {} methods: {tally:?}",
        methods.len()
    );
    assert!(
        calls >= 5 * 40,
        "every service's methods were called ({calls} calls)"
    );
}
