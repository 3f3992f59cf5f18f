//! pace-tower in front of a tonic service: the generated `Greeter` service
//! (proto/greeter.proto) and a server of it behind a [`PaceLayer`], used by
//! the example (`cargo run -p pace-grpc-example --example grpc`) and the
//! tests (tests/grpc.rs).

use std::net::SocketAddr;

use pace_tower::{GateLayer, Limits, PaceLayer, Respond};
use tonic::transport::server::TcpIncoming;
use tonic::{Request, Response, Status};

/// The generated code of proto/greeter.proto.
#[allow(missing_docs, clippy::all)]
pub mod pb {
    tonic::include_proto!("pace.example");
}

use pb::greeter_server::{Greeter, GreeterServer};
use pb::{HelloReply, HelloRequest};

/// The service: says hello, and fails a call named `"intruder"` with
/// `UNAUTHENTICATED` (the answer a refund predicate can look at).
#[derive(Clone, Copy, Debug, Default)]
pub struct Hello;

#[tonic::async_trait]
impl Greeter for Hello {
    async fn hello(&self, req: Request<HelloRequest>) -> Result<Response<HelloReply>, Status> {
        let name = req.into_inner().name;
        if name == "intruder" {
            return Err(Status::unauthenticated("unknown caller"));
        }
        Ok(Response::new(HelloReply {
            message: format!("hello, {name}"),
        }))
    }
}

/// Serves [`Hello`] behind `layer` on a loopback port; returns its address.
///
/// # Errors
/// When the port cannot be bound.
pub async fn serve<L, H>(layer: PaceLayer<L, H>) -> std::io::Result<SocketAddr>
where
    L: Limits,
    H: Respond<tonic::body::Body>,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(layer)
            .add_service(GreeterServer::new(Hello))
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    Ok(addr)
}

/// Serves [`Hello`] behind `gate` on a loopback port; returns its address.
///
/// # Errors
/// When the port cannot be bound.
pub async fn serve_gated(gate: GateLayer) -> std::io::Result<SocketAddr> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(gate)
            .add_service(GreeterServer::new(Hello))
            .serve_with_incoming(TcpIncoming::from(listener)),
    );
    Ok(addr)
}
