//! TCP rendezvous of a multi-process launch, within a bounded time.
//!
//! Rank 0 collects every other rank and hands them a payload (the NCCL unique id).
//!
//! Protocol: a rank connects to rank 0 and sends `MAGIC`, its rank and the world size (u32 LE
//! each). Once all ranks arrived, rank 0 answers each with status 0, a u32 length and the
//! payload. If some never arrive, rank 0 answers the others with status 1 and a message naming
//! the missing ranks, so every rank fails with the same explanation instead of hanging. After a
//! successful rendezvous the connections stay open: they are the control plane's (`control.rs`).

use crate::error::{ExecError, Result};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

const MAGIC: &[u8; 4] = b"SYNC";
const RETRY: Duration = Duration::from_millis(50);

fn error(address: &str, message: impl Into<String>) -> ExecError {
    ExecError::Rendezvous {
        address: address.into(),
        message: message.into(),
    }
}

fn resolve(address: &str) -> Result<SocketAddr> {
    address
        .to_socket_addrs()
        .map_err(|e| error(address, format!("cannot resolve: {e}")))?
        .next()
        .ok_or_else(|| error(address, "resolves to no address"))
}

/// The connections a successful rendezvous leaves open.
pub enum Link {
    /// Rank 0: the connection of every other rank, rank 1 first.
    Hub(Vec<TcpStream>),
    /// Any other rank: its connection to rank 0.
    Spoke(TcpStream),
}

/// Rank 0: listens on `listener` until `world - 1` ranks have arrived or `timeout` passed,
/// then sends `payload` to all of them and returns their connections, rank 1 first. Returns an
/// error naming the ranks that never came.
pub fn serve(
    listener: TcpListener,
    world: u32,
    payload: &[u8],
    timeout: Duration,
) -> Result<Vec<TcpStream>> {
    let address = listener
        .local_addr()
        .map_or_else(|_| "rank 0".to_string(), |a| a.to_string());
    let deadline = Instant::now() + timeout;
    listener
        .set_nonblocking(true)
        .map_err(|e| error(&address, format!("cannot poll the listener: {e}")))?;
    let mut peers: Vec<Option<TcpStream>> = (0..world).map(|_| None).collect();
    let mut arrived = 1;
    while arrived < world && Instant::now() < deadline {
        match listener.accept() {
            Ok((mut stream, from)) => {
                // A stray or broken connection must not fail the launch: skip it.
                let Ok(rank) = read_hello(&mut stream, world, deadline) else {
                    eprintln!("rendezvous at {address}: ignored a bad connection from {from}");
                    continue;
                };
                if rank > 0 && peers[rank as usize].is_none() {
                    peers[rank as usize] = Some(stream);
                    arrived += 1;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(RETRY),
            Err(e) => return Err(error(&address, format!("accept failed: {e}"))),
        }
    }
    let missing: Vec<String> = (1..world)
        .filter(|&r| peers[r as usize].is_none())
        .map(|r| r.to_string())
        .collect();
    let (status, body) = if missing.is_empty() {
        (0u8, payload.to_vec())
    } else {
        (
            1u8,
            format!(
                "rank(s) {} never arrived within {:.1} s",
                missing.join(", "),
                timeout.as_secs_f64()
            )
            .into_bytes(),
        )
    };
    for stream in peers.iter_mut().flatten() {
        let mut message = vec![status];
        message.extend_from_slice(&(body.len() as u32).to_le_bytes());
        message.extend_from_slice(&body);
        // A peer that died after arriving only loses its own answer.
        let _ = stream.write_all(&message);
    }
    if missing.is_empty() {
        Ok(peers.into_iter().flatten().collect())
    } else {
        Err(error(&address, String::from_utf8_lossy(&body)))
    }
}

fn read_hello(stream: &mut TcpStream, world: u32, deadline: Instant) -> std::io::Result<u32> {
    stream.set_nonblocking(false)?;
    stream.set_read_timeout(Some(
        deadline
            .saturating_duration_since(Instant::now())
            .max(Duration::from_millis(10)),
    ))?;
    let mut hello = [0u8; 12];
    stream.read_exact(&mut hello)?;
    let rank = u32::from_le_bytes(hello[4..8].try_into().expect("4 bytes"));
    let their_world = u32::from_le_bytes(hello[8..12].try_into().expect("4 bytes"));
    if &hello[..4] != MAGIC || their_world != world || rank >= world {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a rank of this launch",
        ));
    }
    Ok(rank)
}

/// Rank `rank` > 0: connects to rank 0 at `address` (retrying until it listens) and returns
/// its payload and the open connection, or rank 0's explanation of why the launch failed.
pub fn join(
    address: &str,
    rank: u32,
    world: u32,
    timeout: Duration,
) -> Result<(Vec<u8>, TcpStream)> {
    let deadline = Instant::now() + timeout;
    let target = resolve(address)?;
    let mut stream = loop {
        match TcpStream::connect_timeout(&target, RETRY.max(Duration::from_millis(200))) {
            Ok(stream) => break stream,
            Err(e) if Instant::now() >= deadline => {
                return Err(error(
                    address,
                    format!(
                        "rank 0 never listened within {:.1} s (last error: {e})",
                        timeout.as_secs_f64()
                    ),
                ))
            }
            Err(_) => std::thread::sleep(RETRY),
        }
    };
    let io = |e: std::io::Error| error(address, format!("rank {rank}: {e}"));
    let mut hello = MAGIC.to_vec();
    hello.extend_from_slice(&rank.to_le_bytes());
    hello.extend_from_slice(&world.to_le_bytes());
    stream.write_all(&hello).map_err(io)?;
    // Rank 0 answers at the latest at its own deadline; allow for its start-up lag.
    stream
        .set_read_timeout(Some(
            deadline.saturating_duration_since(Instant::now()) + timeout,
        ))
        .map_err(io)?;
    let mut head = [0u8; 5];
    stream.read_exact(&mut head).map_err(|e| {
        error(
            address,
            format!("rank 0 did not answer rank {rank}: {e} (did rank 0 fail?)"),
        )
    })?;
    let len = u32::from_le_bytes(head[1..5].try_into().expect("4 bytes")) as usize;
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body).map_err(io)?;
    if head[0] == 0 {
        Ok((body, stream))
    } else {
        Err(error(address, String::from_utf8_lossy(&body)))
    }
}

/// Rank 0 binds `address`; everyone else joins it. Returns the payload and the open
/// connections on every rank.
pub fn exchange(
    address: &str,
    rank: u32,
    world: u32,
    payload: impl FnOnce() -> Result<Vec<u8>>,
    timeout: Duration,
) -> Result<(Vec<u8>, Link)> {
    if rank == 0 {
        let listener = TcpListener::bind(resolve(address)?)
            .map_err(|e| error(address, format!("rank 0 cannot listen: {e}")))?;
        let payload = payload()?;
        let peers = serve(listener, world, &payload, timeout)?;
        Ok((payload, Link::Hub(peers)))
    } else {
        let (payload, stream) = join(address, rank, world, timeout)?;
        Ok((payload, Link::Spoke(stream)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_rank_gets_the_payload() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let timeout = Duration::from_secs(10);
        std::thread::scope(|scope| {
            let peers: Vec<_> = (1..3)
                .map(|rank| {
                    let address = address.clone();
                    scope.spawn(move || join(&address, rank, 3, timeout).unwrap().0)
                })
                .collect();
            assert_eq!(serve(listener, 3, b"unique id", timeout).unwrap().len(), 2);
            for peer in peers {
                assert_eq!(peer.join().unwrap(), b"unique id");
            }
        });
    }
}
