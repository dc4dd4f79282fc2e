//! rping's protocol (rdma-core's `librdmacm/examples/rping.c`) on evchan's one-sided
//! operations: either side, against the C `rping` or itself.
//!
//! ```text
//! rping -s [-a ADDR] [-p PORT]                     serve one client
//! rping -c [-a ADDR] [-p PORT] [-C COUNT] [-S SIZE] [-V]
//! ```
//!
//! Defaults: 169.254.77.1 (the soft-RoCE VM's address), port 7174 (rping's), 10 pings of 64
//! bytes. Against the C server, give it the client's size (`rping -s -S SIZE`: its buffer is
//! 64 bytes without, and a larger READ fails at its end); our server takes any size up to 64
//! KiB. Each ping, as rping does it:
//!
//! 1. the client fills its *start* buffer and sends its descriptor;
//! 2. the server RDMA READs the start buffer, then sends a "go ahead";
//! 3. the client sends the descriptor of its *sink* buffer;
//! 4. the server RDMA WRITEs what it read into the sink, then sends a "go ahead";
//! 5. the client (with `-V`) checks that the sink holds what the start buffer held.
//!
//! A descriptor is rping's `struct rping_rdma_info`: the address (8 bytes), rkey (4) and size
//! (4), big-endian, 16 bytes; a "go ahead" is any 16 bytes. Both buffers are evchan
//! [`Exposed`](evchan::remote::Exposed) memory: the start buffer readable by the peer, the
//! sink writable, neither ever a slice while the peer can reach it.

use std::net::SocketAddr;
use std::process::ExitCode;

use evchan::remote::{Access, RemoteBuf, RemoteRead, RemoteWrite};
use evchan::{Config, Connection, Listener};

pub type Result<T> = std::result::Result<T, Box<dyn std::error::Error + Send + Sync>>;

/// `sizeof(struct rping_rdma_info)`: every message of the protocol.
pub const INFO_LEN: usize = 16;
/// rping's largest buffer (`RPING_BUFSIZE`): the messages evchan must carry.
pub const MAX_SIZE: usize = 64 * 1024;

/// `struct rping_rdma_info` of `d`.
pub fn info<A: Access>(d: &RemoteBuf<A>) -> [u8; INFO_LEN] {
    let mut b = [0u8; INFO_LEN];
    b[..8].copy_from_slice(&d.addr().to_be_bytes());
    b[8..12].copy_from_slice(&d.rkey().to_be_bytes());
    b[12..].copy_from_slice(&d.len().to_be_bytes());
    b
}

/// A peer's `struct rping_rdma_info` (untrusted bytes).
pub fn parse_info<A: Access>(msg: &[u8]) -> Result<RemoteBuf<A>> {
    let b: &[u8; INFO_LEN] = msg
        .try_into()
        .map_err(|_| format!("a {}-byte message, not rping's {INFO_LEN}", msg.len()))?;
    let addr = u64::from_be_bytes(b[..8].try_into()?);
    let rkey = u32::from_be_bytes(b[8..12].try_into()?);
    let size = u32::from_be_bytes(b[12..].try_into()?);
    Ok(RemoteBuf::from_parts(addr, size, rkey)?)
}

/// Ping `n`'s data: `rdma-ping-N: ` and letters, a 0 last (rping's server writes back up to
/// and including the first 0).
pub fn ping_data(n: u32, size: usize) -> Vec<u8> {
    let mut d: Vec<u8> = format!("rdma-ping-{n}: ").into_bytes();
    d.truncate(size - 1);
    d.extend((d.len()..size - 1).map(|i| b'A' + ((n as usize + i) % 58) as u8));
    d.push(0);
    d
}

async fn go_ahead(conn: &mut Connection) -> Result<()> {
    match conn.recv().await? {
        Some(m) if m.len() == INFO_LEN => Ok(()),
        Some(m) => Err(format!("a {}-byte go ahead, not {INFO_LEN}", m.len()).into()),
        None => Err("the server left mid-ping".into()),
    }
}

/// The client's side: `count` pings of `size` bytes; with `validate`, each sink checked.
pub async fn client(conn: &mut Connection, count: u32, size: usize, validate: bool) -> Result<()> {
    let start = conn.expose::<RemoteRead>(size)?;
    let sink = conn.expose::<RemoteWrite>(size)?;
    let len = u32::try_from(size)?;
    let (start_d, sink_d) = (
        start.descriptor().slice(0, len)?,
        sink.descriptor().slice(0, len)?,
    );
    let mut got = vec![0u8; size];
    for n in 0..count {
        let data = ping_data(n, size);
        start.write_at(0, &data)?;
        conn.send(info(&start_d)).await?;
        go_ahead(conn).await?;
        conn.send(info(&sink_d)).await?;
        go_ahead(conn).await?;
        if validate {
            sink.read_at(0, &mut got)?;
            if got != data {
                return Err(format!("ping {n}: data mismatch").into());
            }
        }
    }
    // Nobody can reach the buffers any more.
    start.revoke()?;
    sink.revoke()?;
    Ok(())
}

/// The server's side, until the client disconnects: how many pings it served.
pub async fn serve(conn: &mut Connection) -> Result<u32> {
    let mut pings = 0;
    while let Some(msg) = conn.recv().await? {
        let source = parse_info::<RemoteRead>(&msg)?;
        let data = conn.read(&source, 0, source.len() as usize).await?;
        conn.send([0u8; INFO_LEN]).await?;
        let Some(msg) = conn.recv().await? else {
            return Err("the client left mid-ping".into());
        };
        let sink = parse_info::<RemoteWrite>(&msg)?;
        // As rping: the string read, with its 0.
        let n = data
            .iter()
            .position(|b| *b == 0)
            .map_or(data.len(), |i| i + 1);
        conn.write(&sink, 0, &data[..n]).await?;
        conn.send([0u8; INFO_LEN]).await?;
        pings += 1;
    }
    Ok(pings)
}

/// Room for rping's largest buffer in one operation.
pub fn config() -> Config {
    Config::new().max_message(MAX_SIZE as u32)
}

struct Args {
    server: bool,
    addr: SocketAddr,
    count: u32,
    size: usize,
    validate: bool,
}

const USAGE: &str = "usage: rping -s|-c [-a ADDR] [-p PORT] [-C COUNT] [-S SIZE] [-V]";

fn parse_args() -> std::result::Result<Args, String> {
    let mut role = None;
    let mut ip = std::net::IpAddr::from([169, 254, 77, 1]);
    let mut port = 7174u16;
    let (mut count, mut size, mut validate) = (10u32, 64usize, false);
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value\n{USAGE}"));
        let bad = |e: &dyn std::fmt::Display| format!("{flag}: {e}\n{USAGE}");
        match flag.as_str() {
            "-s" => role = Some(true),
            "-c" => role = Some(false),
            "-a" => ip = value()?.parse().map_err(|e| bad(&e))?,
            "-p" => port = value()?.parse().map_err(|e| bad(&e))?,
            "-C" => count = value()?.parse().map_err(|e| bad(&e))?,
            "-S" => size = value()?.parse().map_err(|e| bad(&e))?,
            "-V" => validate = true,
            "-h" | "--help" => return Err(USAGE.to_owned()),
            other => return Err(format!("unknown argument `{other}`\n{USAGE}")),
        }
    }
    if !(32..=MAX_SIZE - 1).contains(&size) {
        return Err(format!(
            "-S: {size} is not within 32..={}\n{USAGE}",
            MAX_SIZE - 1
        ));
    }
    let server = role.ok_or(format!("-s or -c\n{USAGE}"))?;
    let addr = SocketAddr::new(ip, port);
    Ok(Args {
        server,
        addr,
        count,
        size,
        validate,
    })
}

async fn run(args: Args) -> Result<()> {
    if args.server {
        let listener = Listener::bind(args.addr, config()).await?;
        let mut conn = listener.accept().await?.accept(&[]).await?;
        let pings = serve(&mut conn).await?;
        conn.close().await?;
        println!("rping server: {pings} pings served");
    } else {
        let mut conn = Connection::builder()
            .config(config())
            .connect(args.addr)
            .await?;
        client(&mut conn, args.count, args.size, args.validate).await?;
        conn.close().await?;
        println!("rping client: {} pings of {} bytes", args.count, args.size);
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build();
    match rt.map_err(Into::into).and_then(|rt| rt.block_on(run(args))) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("rping: {e}");
            ExitCode::FAILURE
        }
    }
}
