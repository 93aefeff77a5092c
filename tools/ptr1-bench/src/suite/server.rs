//! A fixture server in a child process (`ptr1-bench serve`, on the test bed's server host with
//! `--netns`), killed when dropped.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Stdio};

use anyhow::{Context, Result};

use crate::{Handlers, Transport};

pub(crate) struct Server {
    child: Child,
    pub(crate) addr: SocketAddr,
}

impl Server {
    /// Starts `exe serve --transport T --handlers H EXTRA…` and waits for its address.
    pub(crate) fn start(
        exe: &Path,
        transport: Transport,
        handlers: Handlers,
        extra: &[&str],
    ) -> Result<Self> {
        let listen = format!("{}:0", crate::placement::server_ip());
        let mut child = crate::placement::server_command(&exe.display().to_string())
            .args([
                "serve",
                "--transport",
                transport.name(),
                "--listen",
                &listen,
                "--handlers",
                handlers.name(),
            ])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting a fixture server")?;
        match Self::address(&mut child, transport) {
            Ok(addr) => Ok(Self { child, addr }),
            Err(e) => {
                // A std `Child` is not killed when dropped.
                let _ = child.kill();
                let _ = child.wait();
                Err(e)
            }
        }
    }

    /// The address the fixture prints once it listens (the TLS fixture says where its CA
    /// went first).
    fn address(child: &mut Child, transport: Transport) -> Result<SocketAddr> {
        let stdout = child.stdout.take().context("server stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        loop {
            let line = lines
                .next()
                .transpose()?
                .with_context(|| format!("the {} fixture exited", transport.name()))?;
            if let Some(addr) = line.trim().strip_prefix("listening on ") {
                return addr
                    .parse()
                    .with_context(|| format!("the fixture said {line:?}"));
            }
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
