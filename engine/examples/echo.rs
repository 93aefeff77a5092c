//! The README's example: an echo endpoint on one node, an ask from another.
//!
//! Run: `cargo run -p tensorwire-engine --example echo`.

use std::time::Duration;

use tensorwire_engine::{Node, Reply, TensorMessage};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let server = Node::builder("127.0.0.1:0".parse()?).build()?;
    server.serve("echo", 2, |request| Ok(Reply::Tensor(request.message)))?;

    // `in_process_delivery(false)`: both nodes live in this process, but the example should
    // cross a real socket.
    let client = Node::builder("127.0.0.1:0".parse()?)
        .in_process_delivery(false)
        .build()?;
    let message = TensorMessage::new(
        1,
        &b"{\"dtype\":\"f32\"}"[..],
        vec![vec![0u8; 1 << 20].into()],
    );
    let reply = client
        .ask(
            server.local_addr(),
            "/actors/echo",
            message,
            Duration::from_secs(10),
        )
        .wait()?;
    match reply {
        Reply::Tensor(echoed) => println!("echoed {} bytes over PTR1", echoed.total_bytes()),
        Reply::Single { msg_type, .. } => println!("unexpected single reply {msg_type}"),
    }
    Ok(())
}
