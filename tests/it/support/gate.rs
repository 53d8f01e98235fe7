//! The test's gate for MR code that waits: a "provider" in the operator's mirror runs a program
//! of the root (as `hashicorp/external` runs one), which connects to the gate, says its root and
//! waits for the gate's answer. The arrival is the test's marker that the MR's code runs; the
//! answer ([`Gate::open`]) lets it go on. Nothing waits on a timer.

use std::sync::Arc;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{mpsc, watch};

/// The operator's provider mirror with `example/gate`: a "provider" that runs `./gate.sh` of
/// the root it is used in (MR code, as `hashicorp/external` runs a program the root names).
pub fn gate_mirror() -> tempfile::TempDir {
    let mirror = tempfile::tempdir().unwrap();
    let dir = mirror
        .path()
        .join("registry.terraform.io/example/gate/1.0.0/linux_amd64");
    std::fs::create_dir_all(&dir).unwrap();
    let bin = dir.join("terraform-provider-gate_v1.0.0");
    std::fs::write(&bin, "#!/bin/sh\nexec sh ./gate.sh\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    mirror
}

/// A root's `main.tf` that uses the gate provider, then `rest`.
pub fn gated_tf(rest: &str) -> String {
    format!(
        "terraform {{\n  required_providers {{\n    gate = {{ source = \"example/gate\" }}\n  }}\n}}\n\nprovider \"gate\" {{}}\n\n{rest}"
    )
}

/// The MR's program: connect to the test's gate on `port`, say which root waits, and wait for
/// the gate's answer; then fail (it is no provider), which fails the root's plan.
pub fn gate_sh(port: u16, root: &str) -> String {
    format!(
        "exec perl -MIO::Socket::INET -e '$| = 1; my $s = IO::Socket::INET->new(PeerAddr => \"127.0.0.1\", PeerPort => {port}) or die \"gate: $!\\n\"; print $s \"{root}\\n\"; my $l = <$s>; print STDERR \"gate opened\\n\"; exit 1'\n"
    )
}

/// The test's gate: every program that connects is held until [`Gate::open`]; each arrival
/// is told (the root it named).
pub struct Gate {
    pub port: u16,
    arrived: mpsc::UnboundedReceiver<String>,
    open: watch::Sender<bool>,
}

impl Gate {
    pub async fn start() -> Gate {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (tell, arrived) = mpsc::unbounded_channel();
        let (open, opened) = watch::channel(false);
        let tell = Arc::new(tell);
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let (tell, mut opened) = (tell.clone(), opened.clone());
                tokio::spawn(async move {
                    let mut buf = [0u8; 64];
                    let n = conn.read(&mut buf).await.unwrap_or(0);
                    let root = String::from_utf8_lossy(&buf[..n]).trim().to_string();
                    let _ = tell.send(root);
                    let _ = opened.wait_for(|o| *o).await;
                    let _ = conn.write_all(b"go\n").await;
                });
            }
        });
        Gate {
            port,
            arrived,
            open,
        }
    }

    /// The root whose program arrived, if one did and was not told yet.
    pub fn arrived_already(&mut self) -> Option<String> {
        self.arrived.try_recv().ok()
    }

    /// The root whose program arrived next (within `secs`).
    pub async fn next_arrival(&mut self, secs: u64) -> String {
        tokio::time::timeout(std::time::Duration::from_secs(secs), self.arrived.recv())
            .await
            .unwrap_or_else(|_| panic!("no program reached the gate within {secs} s"))
            .expect("the gate runs")
    }

    /// Let every held program (and every later one) go on.
    pub fn open(&self) {
        self.open.send_replace(true);
    }
}
