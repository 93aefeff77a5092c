//! Nodes with the HTTP/2 transport of `tensorwire-compat` plugged in: clear text (h2c, used
//! for sends when the preference says HTTP/2) or TLS (used for every remote send).

use std::sync::Arc;

use tensorwire_compat::{Http2, Http2Config, TlsConfig};
use tensorwire_engine::{Node, NodeBuilder, Preference, Reply};
use tokio::runtime::Handle;

use crate::Driver;
use crate::pki::{Ca, Identity};

/// How a node speaks HTTP/2.
#[derive(Clone)]
pub enum Wire {
    /// Clear text; sends go over HTTP/2 because the preference says so.
    H2c,
    /// h2c whose idle PING keepalive has this interval and timeout (default 10 s each): a
    /// connection whose peer went silent is closed after about twice this.
    H2cKeepAlive(std::time::Duration),
    /// TLS with this configuration (required, so plaintext is refused, if it can serve TLS).
    Tls(TlsConfig),
}

impl Wire {
    /// A builder for a loopback node on `driver` with this HTTP/2 transport.
    pub fn builder(&self, driver: Driver) -> NodeBuilder {
        self.configure(driver.builder())
    }

    /// Adds this HTTP/2 transport to `builder` (and turns in-process delivery off).
    pub fn configure(&self, builder: NodeBuilder) -> NodeBuilder {
        self.configure_on(builder, None)
    }

    /// [`Wire::configure`] with the transport on `runtime` (`None`: the crate's own).
    pub fn configure_on(&self, builder: NodeBuilder, runtime: Option<Handle>) -> NodeBuilder {
        let builder = builder.in_process_delivery(false);
        let factory = |config| {
            let http2 = Http2::new(config);
            Arc::new(match runtime {
                Some(runtime) => http2.on_runtime(runtime),
                None => http2,
            })
        };
        match self {
            Self::H2c => builder
                .preference(Preference::Http2)
                .transport(factory(Http2Config::h2c())),
            Self::H2cKeepAlive(every) => {
                let mut config = Http2Config::h2c();
                config.keep_alive_interval = *every;
                config.keep_alive_timeout = *every;
                builder
                    .preference(Preference::Http2)
                    .transport(factory(config))
            }
            Self::Tls(tls) => {
                builder.transport(factory(Http2Config::tls(tls.clone(), tls.serves())))
            }
        }
    }

    /// A node with `echo` (handler threads) and `echo-core` (on the driver thread).
    pub fn echo_server(&self, driver: Driver) -> Node {
        let node = self
            .builder(driver)
            .build()
            .expect("the HTTP/2 server node starts");
        node.serve("echo", 2, |request| Ok(Reply::Tensor(request.message)))
            .expect("echo registers");
        node.serve_on_core("echo-core", |request| Ok(Reply::Tensor(request.message)))
            .expect("echo-core registers");
        node
    }
}

/// A CA with a server identity and a client identity (`client-a`).
pub struct Pki {
    /// The CA.
    pub ca: Ca,
    /// `localhost` / `127.0.0.1`.
    pub server: Identity,
    /// `client-a`.
    pub client: Identity,
}

impl Pki {
    /// A fresh PKI.
    pub fn new() -> Self {
        let ca = Ca::new("tensorwire test CA");
        let (server, client) = (ca.server(), ca.client("client-a"));
        Self { ca, server, client }
    }

    /// The server's TLS configuration; `mutual` requires client certificates from the CA.
    pub fn server_tls(&self, mutual: bool) -> TlsConfig {
        TlsConfig::builder()
            .identity_pem(self.server.cert.clone(), self.server.key.clone())
            .trust_pem(self.ca.cert.clone())
            .require_client_cert(mutual)
            .build()
            .expect("server TLS configuration")
    }

    /// A client's TLS configuration trusting the CA, presenting `identity` if given.
    pub fn client_tls(&self, identity: Option<&Identity>) -> TlsConfig {
        let builder = TlsConfig::builder().trust_pem(self.ca.cert.clone());
        let builder = match identity {
            Some(identity) => builder.identity_pem(identity.cert.clone(), identity.key.clone()),
            None => builder,
        };
        builder.build().expect("client TLS configuration")
    }
}

impl Default for Pki {
    fn default() -> Self {
        Self::new()
    }
}
