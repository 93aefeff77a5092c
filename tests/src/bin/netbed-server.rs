//! A server process for the across-hosts tests that need a peer to be killed: a node on the
//! address and driver given (`netbed-server ADDR io_uring|tokio`) with `echo` and `slow`
//! (answers after 300 ms); prints `listening on ADDR` and serves until it is killed.

use std::sync::Arc;
use std::time::Duration;

use tensorwire_engine::{Node, Reply};

fn main() {
    let mut args = std::env::args().skip(1);
    let addr = args
        .next()
        .and_then(|a| a.parse().ok())
        .expect("usage: netbed-server ADDR io_uring|tokio");
    let builder = Node::builder(addr).cores(1).in_process_delivery(false);
    let builder = match args.next().as_deref() {
        Some("tokio") => builder
            .force_fallback(true)
            .fallback(Arc::new(tensorwire_compat::TokioFallback::default())),
        _ => builder,
    };
    let node = builder.build().expect("the node starts");
    node.serve("echo", 2, |request| Ok(Reply::Tensor(request.message)))
        .expect("echo registers");
    node.serve("slow", 2, |request| {
        std::thread::sleep(Duration::from_millis(300));
        Ok(Reply::Tensor(request.message))
    })
    .expect("slow registers");
    println!("listening on {}", node.local_addr());
    loop {
        std::thread::park();
    }
}
