//! The gRPC services: one file per protocol, each a mapping onto the same session engine.

pub mod convert;
pub mod obey;

use paddock_proto::obey::local::v1::local_daemon_service_server::LocalDaemonServiceServer;

use crate::daemon::{Handle, MAX_MESSAGE_BYTES};

/// Every service paddock serves on its socket, plus server reflection.
pub fn router(handle: Handle) -> tonic::transport::server::Router {
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(paddock_proto::FILE_DESCRIPTOR_SET)
        .build_v1()
        .expect("the descriptor set compiled by build.rs is valid");
    let obey = LocalDaemonServiceServer::new(obey::Obey::new(handle))
        .max_decoding_message_size(MAX_MESSAGE_BYTES)
        .max_encoding_message_size(MAX_MESSAGE_BYTES);
    tonic::transport::Server::builder()
        .add_service(reflection)
        .add_service(obey)
}
