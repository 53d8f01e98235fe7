//! The queue's wake-up across replicas: each replica keeps one connection that `LISTEN`s on
//! [`CHANNEL`], and a job enqueued on any replica notifies it when its transaction commits
//! (`capabilities::store::queue`), so every replica's idle workers look at the queue at once
//! rather than at their next poll; a root unit's end is told the same way, to the plan job
//! that waits for it (`capabilities::store::root_units`). A lost connection is made again (a second later), and the
//! workers are woken once then, for a notice missed meanwhile.

use anyhow::Result;
use futures::StreamExt;
use std::time::Duration;
use tokio::sync::watch;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, Config, NoTls, Socket};
use tokio_postgres_rustls::MakeRustlsConnect;
use tokio_util::sync::CancellationToken;

/// The channel a new job, or a unit's end, is told on.
pub(super) const CHANNEL: &str = "planbot_jobs";

/// How the listening connection is made: the pool's own settings.
#[derive(Clone)]
pub(super) struct Listener {
    pub config: Config,
    pub tls: Option<MakeRustlsConnect>,
}

/// Listen until `stop`; the receiver's value counts the notices, and each time listening
/// starts (a notice may have been missed before).
pub(super) fn spawn(listener: Listener, stop: CancellationToken) -> watch::Receiver<u64> {
    let (tell, notices) = watch::channel(0);
    tokio::spawn(async move {
        let mut said = false;
        loop {
            let listened = tokio::select! {
                r = listen(&listener, &tell) => r,
                _ = stop.cancelled() => return,
            };
            if let Err(e) = listened {
                if !said {
                    tracing::warn!(error = %format!("{e:#}"), "not listening for new jobs of other replicas (each looks at the queue every 2 s meanwhile); trying again");
                    said = true;
                }
            }
            tell.send_modify(|n| *n += 1);
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = stop.cancelled() => return,
            }
        }
    });
    notices
}

async fn listen(listener: &Listener, tell: &watch::Sender<u64>) -> Result<()> {
    match &listener.tls {
        None => listen_over(&listener.config, NoTls, tell).await,
        Some(tls) => listen_over(&listener.config, tls.clone(), tell).await,
    }
}

/// One connection's life: `LISTEN`, then each notice told, until the connection ends.
async fn listen_over<T>(config: &Config, tls: T, tell: &watch::Sender<u64>) -> Result<()>
where
    T: MakeTlsConnect<Socket> + Send,
    T::Stream: Send + 'static,
    T::TlsConnect: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
    let (client, mut connection) = config.connect(tls).await?;
    let forward = tell.clone();
    let messages = tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
        while let Some(message) = messages.next().await {
            if let AsyncMessage::Notification(_) = message? {
                forward.send_modify(|n| *n += 1);
            }
        }
        Ok::<(), tokio_postgres::Error>(())
    });
    client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
    // Listening from now on: the workers look once, for what was queued before.
    tell.send_modify(|n| *n += 1);
    let ended = messages.await;
    drop(client);
    ended??;
    Ok(())
}
