//! Parameter-server push/pull over any transport of whole messages, as BytePS runs a key.
//!
//! Every worker pushes its payload to the server rank, which decodes them in rank order, re-encodes
//! the sum and sends it back to every worker.

use crate::compress::Codec;
use crate::error::{ExecError, Result};
use std::sync::atomic::AtomicBool;

/// Which half of a push/pull a message belongs to (transports may tell them apart by tag).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Leg {
    /// A worker's payload on its way to the server.
    Push,
    /// The server's re-encoded sum on its way back to every worker.
    Pull,
}

impl Leg {
    /// What a message of this leg is, for errors.
    pub fn what(self) -> &'static str {
        match self {
            Leg::Push => "a parameter-server push",
            Leg::Pull => "the parameter server's pull",
        }
    }
}

/// One rank's end of a transport of messages of any length.
pub trait Messages {
    /// This rank's index and the transport's ranks.
    fn place(&self) -> (usize, usize);
    /// Sends `bytes` to rank `to`.
    fn send(&self, to: usize, bytes: Vec<u8>, leg: Leg, abort: &AtomicBool) -> Result<()>;
    /// The next message of `leg` from rank `from`.
    fn receive(&self, from: usize, leg: Leg, abort: &AtomicBool) -> Result<Vec<u8>>;
}

/// Push/pull of `mine` with the server on rank `server`: the server decodes every pushed
/// payload (its own included) in rank order with `codec`, re-encodes the sum of `numel`
/// elements with `server_codec`, and every rank gets that payload, which is returned.
pub fn push_pull(
    link: &dyn Messages,
    mine: Vec<u8>,
    server: usize,
    codec: &mut dyn Codec,
    server_codec: &mut dyn Codec,
    numel: usize,
    abort: &AtomicBool,
) -> Result<Vec<u8>> {
    let (rank, world) = link.place();
    if server >= world {
        return Err(ExecError::Protocol {
            compressor: codec.compressor().to_string(),
            message: format!("push/pull server rank {server} is outside the {world} ranks"),
        });
    }
    if rank != server {
        link.send(server, mine, Leg::Push, abort)?;
        return link.receive(server, Leg::Pull, abort);
    }
    let mut sum = vec![0.0f32; numel];
    for from in 0..world {
        if from == rank {
            codec.decode_add(&mine, &mut sum)?;
        } else {
            let pushed = link.receive(from, Leg::Push, abort)?;
            codec.decode_add(&pushed, &mut sum)?;
        }
    }
    let mut pulled = Vec::new();
    server_codec.encode(&sum, &mut pulled)?;
    for to in (0..world).filter(|&to| to != rank) {
        link.send(to, pulled.clone(), Leg::Pull, abort)?;
    }
    Ok(pulled)
}
