//! The gRPC services: one file per protocol, each a mapping onto the same session engine.

pub mod aria;
pub mod convert;
pub mod extensions;
pub mod history;
pub mod obey;
pub mod sunbeam;
pub mod watch;

use paddock_proto::aria::v1 as aria_pb;
use paddock_proto::obey::local::v1::local_daemon_service_server::LocalDaemonServiceServer;

use crate::transport::MESSAGE_MAX_BYTES;

/// A new session id (`sess_<ULID>`) and its short form (the last 6 characters, lower case),
/// for default agent names such as `<provider>-<short id>` (the obey seed's convention).
pub fn new_session_id() -> (paddock_core::SessionId, String) {
    let ulid = ulid::Ulid::new().to_string();
    let short = ulid[ulid.len() - 6..].to_ascii_lowercase();
    (paddock_core::SessionId(format!("sess_{ulid}")), short)
}

/// A new campaign id (`camp_<ULID>`).
pub fn new_campaign_id() -> String {
    format!("camp_{}", ulid::Ulid::new())
}

/// Every service paddock serves on a socket, with server reflection and health naming them. The
/// same router serves paddock's own socket and the Aria socket; sunbeam's `CodeAgent` is served
/// where `sunbeam` is given (paddock's own socket).
pub async fn router(
    aria: aria::AriaConfig,
    sunbeam: Option<sunbeam::CodeAgent>,
) -> tonic::transport::server::Router<crate::transport::ServerLayer> {
    use tonic::server::NamedService;
    let handle = aria.handle.clone();
    type Obey = LocalDaemonServiceServer<obey::Obey>;
    let mut names = vec![
        <Obey as NamedService>::NAME,
        <aria_pb::task_service_server::TaskServiceServer<aria::Tasks> as NamedService>::NAME,
        <aria_pb::notification_service_server::NotificationServiceServer<aria::Notifications> as NamedService>::NAME,
        <aria_pb::session_service_server::SessionServiceServer<aria::Sessions> as NamedService>::NAME,
        <aria_pb::container_service_server::ContainerServiceServer<aria::Containers> as NamedService>::NAME,
    ];
    if sunbeam.is_some() {
        names.push(
            <paddock_proto::sunbeam::code::v1::code_agent_server::CodeAgentServer<
                sunbeam::CodeAgent,
            > as NamedService>::NAME,
        );
    }
    macro_rules! limited {
        ($svc:expr) => {
            $svc.max_decoding_message_size(MESSAGE_MAX_BYTES)
                .max_encoding_message_size(MESSAGE_MAX_BYTES)
        };
    }
    crate::transport::introspected_server(&names)
        .await
        .add_service(limited!(LocalDaemonServiceServer::new(obey::Obey::new(
            handle
        ))))
        .add_service(limited!(
            aria_pb::task_service_server::TaskServiceServer::new(aria::Tasks(aria.clone()))
        ))
        .add_service(limited!(
            aria_pb::notification_service_server::NotificationServiceServer::new(
                aria::Notifications(aria.clone())
            )
        ))
        .add_service(limited!(
            aria_pb::session_service_server::SessionServiceServer::new(aria::Sessions(
                aria.clone()
            ))
        ))
        .add_service(limited!(
            aria_pb::container_service_server::ContainerServiceServer::new(aria::Containers(
                aria.clone()
            ))
        ))
        .add_optional_service(sunbeam.map(|s| {
            limited!(paddock_proto::sunbeam::code::v1::code_agent_server::CodeAgentServer::new(s))
        }))
}
