//! A tonic server behind a `PaceLayer`: one call per second per client
//! (`x-client-id` metadata), answered in gRPC when a client goes over.
//!
//!     cargo run -p pace-grpc-example --example grpc
//!
//! A client calls three times in a row: the first passes, the second is
//! `RESOURCE_EXHAUSTED` with the wait (`grpc-retry-pushback-ms` and a
//! `google.rpc.RetryInfo`), and a call without `x-client-id` is
//! `INVALID_ARGUMENT`.

use std::sync::Arc;

use http::HeaderName;
use pace::{Pace, Rate};
use pace_grpc_example::pb::greeter_client::GreeterClient;
use pace_grpc_example::pb::HelloRequest;
use pace_tower::{Header, Limit, PaceLayer};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let per_client = Arc::new(Pace::builder(Rate::per_second(1)?).build()?);
    let layer = PaceLayer::builder()
        .limit(Limit::new(
            "per-client",
            per_client,
            Header(HeaderName::from_static("x-client-id")),
        ))
        .build()?;
    let addr = pace_grpc_example::serve(layer).await?;

    let mut client = GreeterClient::connect(format!("http://{addr}")).await?;
    for client_id in [Some("alice"), Some("alice"), None] {
        let mut req = tonic::Request::new(HelloRequest {
            name: "alice".into(),
        });
        if let Some(id) = client_id {
            req.metadata_mut().insert("x-client-id", id.parse()?);
        }
        match client.hello(req).await {
            Ok(reply) => println!("ok: {}", reply.into_inner().message),
            Err(status) => {
                let pushback = status.metadata().get("grpc-retry-pushback-ms").cloned();
                println!(
                    "{:?}: {} (grpc-retry-pushback-ms: {pushback:?})",
                    status.code(),
                    status.message()
                );
            }
        }
    }
    Ok(())
}
