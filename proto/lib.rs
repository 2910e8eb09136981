//! The gRPC wire contracts paddock speaks, generated at build time from the
//! `.proto` files beside this file.
//!
//! The contracts are the seed specifications' protos **verbatim**: package
//! names, service names, message names, field names, field numbers and enum
//! values are exactly the seeds', so a client generated from any of the
//! original protos works against paddock unchanged. The only additions, each
//! marked with a `// paddock extension:` comment, are in `obey.local.v1`
//! (`proto/obey/local/v1/daemon.proto`: the messages of the seed's "existing"
//! RPCs, a few enum values and fields, and campaign / activity-history RPCs) and
//! in `runner.v1` (`proto/runner/v1/runner.proto`: `RunnerEvent.seq`, an
//! `EventsTruncated` payload, `RunCommandRequest.keep_stdin`, and the
//! `ListRuns` / `AttachRun` / `WriteStdin` / `StopRun` RPCs) and in `aria.v1`
//! (a session-status notification payload, and `TaskService.ListTasks`).
//!
//! | module | proto package | services |
//! |---|---|---|
//! | [`obey::local::v1`] | `obey.local.v1` | `LocalDaemonService` |
//! | [`runner::v1`] | `runner.v1` | `Runner` |
//! | [`sunbeam::code::v1`] | `sunbeam.code.v1` | `CodeAgent` |
//! | [`aria::v1`] | `aria.v1` | `TaskService`, `NotificationService`, `ContainerService`, `SessionService` |
//!
//! Each module holds the prost messages plus tonic's `*_client` and
//! `*_server` modules. The protos are compiled with `protox` (pure Rust), so
//! no system `protoc` is needed. [`FILE_DESCRIPTOR_SET`] is the encoded
//! `FileDescriptorSet` of every file (imports included), for
//! tonic-reflection.

/// `obey.local.v1`: the obey daemon's `LocalDaemonService`.
pub mod obey {
    pub mod local {
        #[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
        pub mod v1 {
            tonic::include_proto!("obey.local.v1");
        }
    }
}

/// `runner.v1`: the centaurx `Runner` service.
pub mod runner {
    #[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
    pub mod v1 {
        tonic::include_proto!("runner.v1");
    }
}

/// `sunbeam.code.v1`: the sunbeam `CodeAgent` service.
pub mod sunbeam {
    pub mod code {
        #[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
        pub mod v1 {
            tonic::include_proto!("sunbeam.code.v1");
        }
    }
}

/// `aria.v1`: the Aria runtime's task, notification, container and session
/// services.
pub mod aria {
    #[allow(clippy::all, clippy::pedantic, missing_docs, rustdoc::all)]
    pub mod v1 {
        tonic::include_proto!("aria.v1");
    }
}

/// The codec of every generated client and server: prost's, with 1 KiB message buffers
/// instead of tonic's 8 KiB. Each open stream holds one on each side for as long as it is
/// open: a daemon with a thousand agents in its runner keeps a thousand `Exec` streams and a
/// thousand agents' turn streams, whose events are a few hundred bytes each. A buffer grows
/// as a larger message needs; the point where an encoder yields (32 KiB) is tonic's.
#[derive(Debug, Clone)]
pub struct Codec<T, U>(std::marker::PhantomData<(T, U)>);

impl<T, U> Default for Codec<T, U> {
    fn default() -> Self {
        Codec(std::marker::PhantomData)
    }
}

/// A stream's message buffers: 1 KiB to start with; an encoder yields past 32 KiB.
fn buffers() -> tonic::codec::BufferSettings {
    tonic::codec::BufferSettings::new(1024, 32 * 1024)
}

impl<T, U> tonic::codec::Codec for Codec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = Encoder<T>;
    type Decoder = Decoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        Encoder(std::marker::PhantomData)
    }

    fn decoder(&mut self) -> Self::Decoder {
        Decoder(std::marker::PhantomData)
    }
}

/// [`Codec`]'s encoder: a message is encoded into a `Vec` of its size, then copied into the
/// stream's buffer in one piece.
///
/// prost writes a varint a byte at a time through `BufMut::put_u8`. Into tonic's buffer (a
/// `BytesMut`) each byte is a call to its `put_slice` and one to `memcpy`; into a `Vec` it is
/// a store. Encoding a page of 100 listed sessions (20 KiB) was a fifth of the daemon's CPU
/// answering `session list --all`, two thirds of it in those calls.
#[derive(Debug)]
pub struct Encoder<T>(std::marker::PhantomData<T>);

impl<T: prost::Message> tonic::codec::Encoder for Encoder<T> {
    type Item = T;
    type Error = tonic::Status;

    fn encode(
        &mut self,
        item: T,
        buf: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), Self::Error> {
        use prost::bytes::BufMut as _;
        buf.put_slice(&item.encode_to_vec());
        Ok(())
    }

    fn buffer_settings(&self) -> tonic::codec::BufferSettings {
        buffers()
    }
}

/// [`Codec`]'s decoder: prost's, except that the message is read as a slice, and that a page
/// of listed sessions gets its vector sized for all of them first.
///
/// tonic hands the decoder a `Buf` over its `BytesMut`: prost then reads each varint through
/// the trait and advances the `BytesMut` after each field and each piece of a string. The
/// message is one contiguous piece there, so it is read as a `&[u8]` instead, whose advance is
/// a pointer's: a page of 100 listed sessions (20 KB) decoded in 42 µs instead of 57.
///
/// prost pushes each repeated message onto its `Vec` as it comes, and a `SessionInfo` is
/// 480 bytes: a page of 100 grew seven times, copying 60 KiB and faulting in new pages each
/// time (a tenth of the CLI's `session list --all` beyond what `session list` costs).
#[derive(Debug)]
pub struct Decoder<U>(std::marker::PhantomData<U>);

impl<U: prost::Message + Default + 'static> tonic::codec::Decoder for Decoder<U> {
    type Item = U;
    type Error = tonic::Status;

    fn decode(&mut self, buf: &mut tonic::codec::DecodeBuf<'_>) -> Result<Option<U>, Self::Error> {
        use prost::bytes::Buf as _;
        let mut item = U::default();
        if let Some(page) = (&mut item as &mut dyn std::any::Any)
            .downcast_mut::<obey::local::v1::ListSessionsResponse>()
        {
            page.sessions.reserve_exact(occurrences(buf.chunk(), 1));
        }
        // As tonic's prost codec answers a message it cannot decode.
        let invalid = |e: prost::DecodeError| tonic::Status::internal(e.to_string());
        let len = buf.remaining();
        match buf.chunk() {
            // The message in one piece (tonic's buffer always is): read as a slice.
            whole if whole.len() == len => {
                item.merge(whole).map_err(invalid)?;
                buf.advance(len);
            }
            _ => item.merge(buf).map_err(invalid)?,
        }
        Ok(Some(item))
    }

    fn buffer_settings(&self) -> tonic::codec::BufferSettings {
        buffers()
    }
}

/// How many times field `field` (length-delimited) occurs at the top of the encoded message
/// `bytes`; counting stops where the bytes are not a message (decoding then says why).
fn occurrences(mut bytes: &[u8], field: u32) -> usize {
    use prost::encoding::{decode_key, skip_field, DecodeContext, WireType};
    let mut n = 0;
    while let Ok((tag, wire_type)) = decode_key(&mut bytes) {
        if skip_field(wire_type, tag, &mut bytes, DecodeContext::default()).is_err() {
            break;
        }
        n += usize::from(tag == field && wire_type == WireType::LengthDelimited);
    }
    n
}

/// The encoded `google.protobuf.FileDescriptorSet` of every contract (with
/// its imports), for `tonic_reflection::server::Builder::register_encoded_file_descriptor_set`.
pub const FILE_DESCRIPTOR_SET: &[u8] =
    include_bytes!(concat!(env!("OUT_DIR"), "/paddock_descriptor.bin"));

#[cfg(test)]
mod tests {
    use super::FILE_DESCRIPTOR_SET;
    use prost::Message as _;
    use prost_types::{DescriptorProto, FileDescriptorSet};

    fn fds() -> FileDescriptorSet {
        FileDescriptorSet::decode(FILE_DESCRIPTOR_SET).expect("descriptor set decodes")
    }

    fn services(fds: &FileDescriptorSet) -> Vec<String> {
        fds.file
            .iter()
            .flat_map(|f| {
                f.service
                    .iter()
                    .map(move |s| format!("{}.{}", f.package(), s.name()))
            })
            .collect()
    }

    fn message<'a>(fds: &'a FileDescriptorSet, package: &str, name: &str) -> &'a DescriptorProto {
        fds.file
            .iter()
            .filter(|f| f.package() == package)
            .flat_map(|f| f.message_type.iter())
            .find(|m| m.name() == name)
            .unwrap_or_else(|| panic!("message {package}.{name} missing"))
    }

    fn field_number(fds: &FileDescriptorSet, package: &str, msg: &str, field: &str) -> i32 {
        message(fds, package, msg)
            .field
            .iter()
            .find(|f| f.name() == field)
            .unwrap_or_else(|| panic!("field {package}.{msg}.{field} missing"))
            .number()
    }

    fn enum_value(fds: &FileDescriptorSet, package: &str, enum_name: &str, value: &str) -> i32 {
        fds.file
            .iter()
            .filter(|f| f.package() == package)
            .flat_map(|f| f.enum_type.iter())
            .find(|e| e.name() == enum_name)
            .unwrap_or_else(|| panic!("enum {package}.{enum_name} missing"))
            .value
            .iter()
            .find(|v| v.name() == value)
            .unwrap_or_else(|| panic!("enum value {enum_name}.{value} missing"))
            .number()
    }

    #[test]
    fn a_page_of_sessions_is_counted_before_it_is_decoded() {
        use crate::obey::local::v1::{ListSessionsResponse, SessionInfo};
        let session = |id: &str| SessionInfo {
            id: id.into(),
            tokens_input: 300,
            pid: 42,
            ..Default::default()
        };
        let page = ListSessionsResponse {
            sessions: vec![session("sess_a"), SessionInfo::default(), session("sess_c")],
            next_page_token: "sess_c".into(),
        };
        let bytes = page.encode_to_vec();
        assert_eq!(super::occurrences(&bytes, 1), 3);
        assert_eq!(super::occurrences(&bytes, 100), 1);
        assert_eq!(super::occurrences(&[], 1), 0);
        // Cut inside the last session: the two whole ones are counted, then counting stops
        // (prost's decoding says what is wrong).
        let cut = bytes.len() - (3 + page.next_page_token.len()) - 2;
        assert_eq!(super::occurrences(&bytes[..cut], 1), 2);
    }

    #[test]
    fn every_seed_service_is_in_the_descriptor_set() {
        let fds = fds();
        let services = services(&fds);
        for expected in [
            "obey.local.v1.LocalDaemonService",
            "runner.v1.Runner",
            "sunbeam.code.v1.CodeAgent",
            "aria.v1.TaskService",
            "aria.v1.NotificationService",
            "aria.v1.ContainerService",
            "aria.v1.SessionService",
        ] {
            assert!(
                services.iter().any(|s| s == expected),
                "{expected} missing from {services:?}"
            );
        }
    }

    #[test]
    fn descriptor_set_carries_the_well_known_imports() {
        let fds = fds();
        for name in [
            "google/protobuf/timestamp.proto",
            "google/protobuf/duration.proto",
        ] {
            assert!(fds.file.iter().any(|f| f.name() == name), "{name} missing");
        }
    }

    #[test]
    fn seed_field_numbers_are_kept() {
        let fds = fds();
        let cases = [
            ("obey.local.v1", "SessionInfo", "working_dir", 19),
            ("obey.local.v1", "SessionInfo", "error_message", 18),
            ("obey.local.v1", "StateResponse", "active_sessions", 10),
            ("obey.local.v1", "SessionSummary", "status", 5),
            (
                "obey.local.v1",
                "CreateSessionRequest",
                "initial_message",
                11,
            ),
            ("runner.v1", "ItemEvent", "raw", 11),
            ("runner.v1", "ExecEvent", "raw", 7),
            ("runner.v1", "ExecResumeRequest", "resume_session_id", 5),
            ("sunbeam.code.v1", "StartSession", "client_tools", 8),
            ("sunbeam.code.v1", "HistoryEntry", "role", 1),
            ("sunbeam.code.v1", "HistoryEntry", "content", 2),
            ("sunbeam.code.v1", "ServerMessage", "error", 8),
            ("aria.v1", "Task", "current_operation", 17),
            ("aria.v1", "TaskOutput", "progress", 5),
            ("aria.v1", "ContainerLog", "stream", 2),
        ];
        for (package, msg, field, number) in cases {
            assert_eq!(
                field_number(&fds, package, msg, field),
                number,
                "{package}.{msg}.{field}"
            );
        }
    }

    #[test]
    fn seed_enum_values_are_kept() {
        let fds = fds();
        let cases = [
            ("obey.local.v1", "SessionStatus", "SESSION_STATUS_FAILED", 7),
            (
                "obey.local.v1",
                "SessionProvider",
                "SESSION_PROVIDER_OPENAI_API",
                4,
            ),
            ("obey.local.v1", "ActivityType", "ACTIVITY_TYPE_STATUS", 6),
            ("runner.v1", "ProcessSignal", "PROCESS_SIGNAL_KILL", 3),
            ("runner.v1", "EventType", "EVENT_ERROR", 8),
            ("runner.v1", "ItemType", "ITEM_ERROR", 8),
            ("sunbeam.code.v1", "StatusKind", "THINKING", 3),
            ("aria.v1", "TaskStatus", "TIMEOUT", 6),
            ("aria.v1", "MessageRole", "TOOL", 4),
        ];
        for (package, enum_name, value, number) in cases {
            assert_eq!(
                enum_value(&fds, package, enum_name, value),
                number,
                "{enum_name}.{value}"
            );
        }
    }

    #[test]
    fn paddock_extensions_are_present() {
        let fds = fds();
        let fields = [
            ("SessionActivityEvent", "seq", 10),
            ("SessionStatusEvent", "seq", 6),
            ("SessionInfo", "error_code", 20),
            ("SessionInfo", "provider_config", 21),
            ("SessionInfo", "timeout", 22),
            ("WatchActivityRequest", "after_seq", 2),
            ("CreateSessionRequest", "environment_spec", 12),
            ("SessionInfo", "environment_spec", 28),
            ("SessionInfo", "environment_state", 29),
            ("SessionEnvironment", "driver", 1),
            ("SessionEnvironment", "worktree", 2),
            ("SessionEnvironment", "network", 3),
            ("SessionEnvironment", "ssh", 11),
            ("SessionEnvironment", "qemu", 12),
            ("QemuOptions", "flags", 2),
            ("SessionEnvironment", "kubernetes", 13),
            ("KubernetesOptions", "pod_spec_json", 3),
            ("KubernetesOptions", "context", 5),
            ("SessionInfo", "disconnected", 30),
            ("SshTarget", "host", 1),
            ("SshTarget", "remote_dir", 8),
            ("ListSessionsRequest", "page_size", 101),
        ];
        for (msg, field, number) in fields {
            assert_eq!(field_number(&fds, "obey.local.v1", msg, field), number);
        }
        let values = [
            ("SessionProvider", "SESSION_PROVIDER_GEMINI", 5),
            ("SessionProvider", "SESSION_PROVIDER_ACP", 6),
            ("SessionProvider", "SESSION_PROVIDER_SCRIPTED", 7),
            ("SessionStatus", "SESSION_STATUS_WAITING", 8),
        ];
        for (enum_name, value, number) in values {
            assert_eq!(enum_value(&fds, "obey.local.v1", enum_name, value), number);
        }
        let daemon = fds
            .file
            .iter()
            .flat_map(|f| f.service.iter())
            .find(|s| s.name() == "LocalDaemonService")
            .expect("LocalDaemonService");
        let methods: Vec<&str> = daemon.method.iter().map(|m| m.name()).collect();
        for rpc in [
            "ReportCampaignEvent",
            "Shutdown",
            "CreateSession",
            "WatchAllSessions",
            "AddCampaign",
            "ListCampaigns",
            "RemoveCampaign",
            "ListActivities",
            "WatchActivity",
        ] {
            assert!(methods.contains(&rpc), "{rpc} missing from {methods:?}");
        }
        let watch = daemon
            .method
            .iter()
            .find(|m| m.name() == "WatchActivity")
            .expect("WatchActivity");
        assert!(watch.server_streaming());
        assert_eq!(watch.output_type(), ".obey.local.v1.SessionActivityEvent");
    }

    #[test]
    fn runner_extensions_are_present() {
        let fds = fds();
        for (msg, field, number) in [
            ("RunnerEvent", "seq", 10),
            ("RunnerEvent", "truncated", 11),
            ("RunCommandRequest", "keep_stdin", 6),
            ("AttachRunRequest", "after_seq", 2),
            ("StopRunRequest", "grace_ms", 2),
            ("AckRunRequest", "run_id", 1),
            ("AckRunRequest", "seq", 2),
            ("SetLimitsRequest", "max_runs", 1),
        ] {
            assert_eq!(field_number(&fds, "runner.v1", msg, field), number);
        }
        let runner = fds
            .file
            .iter()
            .flat_map(|f| f.service.iter())
            .find(|s| s.name() == "Runner")
            .expect("Runner");
        let methods: Vec<&str> = runner.method.iter().map(|m| m.name()).collect();
        assert_eq!(
            methods,
            [
                "Exec",
                "ExecResume",
                "RunCommand",
                "SignalSession",
                "ListRuns",
                "AttachRun",
                "WriteStdin",
                "StopRun",
                "AckRun",
                "SetLimits"
            ]
        );
    }

    #[test]
    fn generated_types_are_usable() {
        use crate::obey::local::v1::{SessionInfo, SessionStatus};
        let info = SessionInfo {
            id: "sess_1".into(),
            status: SessionStatus::Waiting as i32,
            error_code: "OBEY-2031".into(),
            ..Default::default()
        };
        let decoded = SessionInfo::decode(info.encode_to_vec().as_slice()).expect("round trip");
        assert_eq!(decoded, info);
        assert_eq!(decoded.status(), SessionStatus::Waiting);

        let entry = crate::sunbeam::code::v1::HistoryEntry {
            role: "user".into(),
            content: "hi".into(),
        };
        assert_eq!(entry.content, "hi");
    }
}
