//! A real server on 127.0.0.1 (axum::serve on port 0) and a hyper client.
#![allow(dead_code)]

use std::net::SocketAddr;

use axum::Router;
use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use hyper::{Request, Response};
use tokio::net::{TcpListener, TcpStream};

/// Serves `app` on 127.0.0.1 with the peer address as `ConnectInfo`.
pub async fn serve(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(
            listener,
            app.into_make_service_with_connect_info::<SocketAddr>(),
        )
        .await
        .unwrap();
    });
    addr
}

/// Serves `app` on 127.0.0.1 without `ConnectInfo`.
pub async fn serve_plain(app: Router) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        axum::serve(listener, app).await.unwrap();
    });
    addr
}

/// A persistent HTTP/1 connection.
pub struct Client {
    send: hyper::client::conn::http1::SendRequest<Full<Bytes>>,
    addr: SocketAddr,
}

impl Client {
    pub async fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let io = hyper_util::rt::TokioIo::new(stream);
        let (send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(async move {
            let _ = conn.await;
        });
        Client { send, addr }
    }

    /// Sends a request to `path` with `headers`, returns the response with
    /// its body collected.
    pub async fn get(&mut self, path: &str, headers: &[(&str, &str)]) -> Response<Bytes> {
        let mut b = Request::builder()
            .uri(path)
            .header("host", self.addr.to_string());
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        self.send_req(b.body(Full::new(Bytes::new())).unwrap())
            .await
    }

    pub async fn send_req(&mut self, req: Request<Full<Bytes>>) -> Response<Bytes> {
        self.send.ready().await.unwrap();
        let resp = self.send.send_request(req).await.unwrap();
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.unwrap().to_bytes();
        Response::from_parts(parts, body)
    }
}

/// One request on a fresh connection.
pub async fn get(addr: SocketAddr, path: &str, headers: &[(&str, &str)]) -> Response<Bytes> {
    Client::connect(addr).await.get(path, headers).await
}

pub fn header<'a, B>(r: &'a Response<B>, name: &str) -> Option<&'a str> {
    r.headers().get(name).map(|v| v.to_str().unwrap())
}
