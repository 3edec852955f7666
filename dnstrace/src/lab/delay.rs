//! A delay line in front of the upstream resolver, for `slow-upstream`: this
//! kernel has no netem, so the delay is added here and the answers still come
//! from the real resolver behind it.
use std::{net::SocketAddr, sync::Arc, time::Duration};

use anyhow::{Context as _, Result};
use tokio::{net::UdpSocket, sync::Semaphore, time::timeout};

/// Queries held at once; more are dropped, as a full link would.
const IN_FLIGHT: usize = 4096;

pub async fn delay_line(listen: SocketAddr, to: SocketAddr, delay: Duration) -> Result<()> {
    let front = Arc::new(
        UdpSocket::bind(listen)
            .await
            .with_context(|| format!("binding {listen}"))?,
    );
    let slots = Arc::new(Semaphore::new(IN_FLIGHT));
    let mut buf = vec![0u8; 65535];
    loop {
        let (n, client) = front.recv_from(&mut buf).await?;
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            continue;
        };
        let query = buf[..n].to_vec();
        let front = front.clone();
        tokio::spawn(async move {
            let _permit = permit;
            tokio::time::sleep(delay).await;
            if let Some(reply) = ask(&query, to).await {
                let _ = front.send_to(&reply, client).await;
            }
        });
    }
}

async fn ask(query: &[u8], to: SocketAddr) -> Option<Vec<u8>> {
    let sock = UdpSocket::bind("127.0.0.1:0").await.ok()?;
    sock.send_to(query, to).await.ok()?;
    let mut buf = vec![0u8; 65535];
    let (n, _) = timeout(Duration::from_secs(5), sock.recv_from(&mut buf))
        .await
        .ok()?
        .ok()?;
    buf.truncate(n);
    Some(buf)
}
