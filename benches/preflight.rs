//! Preflight cost against a real-sized cluster: 3 nodes holding 50 guests, and a plan of 50
//! guests (VMs and containers, 30 created with fixed ids, 10 resized, 10 deleted, on local and
//! shared storage, on two bridges), checked by the service's preflight
//! (`flows::preflight::for_plan`) against the stateful fake Proxmox API of the tests over
//! loopback HTTP, then by `planbot preflight PLAN --config CFG --format json` (the binary).
//!
//! `cargo bench --bench preflight` prints the API calls one preflight makes (by endpoint) and
//! the wall time of 30 preflights (min, median, max), in process and as the command. Under
//! `cargo test --all-targets` (no `--bench`) it runs once, to stay fast. The fake answers at
//! once: the time is planbot's own cost plus loopback HTTP; against a real cluster add one round
//! trip per call.

#[path = "../tests/it/support/fake_proxmox.rs"]
mod fake_proxmox;

use fake_proxmox::{Cluster, FakeProxmox, NodeHardware, GIB};
use planbot::capabilities::proxmox::ProxmoxEndpoint;
use planbot::core::plan::Plan;
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

const TOKEN: &str = "tofu@pve!plan";
const SECRET: &str = "5b2f0c1e-3a4d-4e6f-8a9b-0c1d2e3f4a5b";
const NODES: [&str; 3] = ["pve01", "pve02", "pve03"];

fn guest(i: usize, container: bool, node: &str, cores: u64, mem: u64, gb: u64) -> Value {
    let store = if i.is_multiple_of(3) {
        "nfs-images"
    } else {
        "local-lvm"
    };
    let bridge = if i.is_multiple_of(2) {
        "vmbr0"
    } else {
        "vmbr1"
    };
    let nic = if container {
        json!({"network_interface": [{"name": "eth0", "bridge": bridge, "enabled": true}]})
    } else {
        json!({"network_device": [{"bridge": bridge, "enabled": true, "model": "virtio"}]})
    };
    let mut v = json!({"node_name": node, "started": true, "vm_id": 1000 + i,
        "cpu": [{"cores": cores, "sockets": 1}], "memory": [{"dedicated": mem}],
        "disk": [{"datastore_id": store, "size": gb, "interface": "virtio0"}],
        "unprivileged": true});
    for (k, val) in nic.as_object().unwrap() {
        v[k] = val.clone();
    }
    v
}

/// 50 guests on 3 nodes: 30 created, 10 resized (memory and disk), 10 deleted (`show -json`).
fn plan_json() -> String {
    let mut changes = Vec::new();
    for i in 0..50 {
        let container = i % 5 == 4;
        let t = if container {
            "proxmox_virtual_environment_container"
        } else {
            "proxmox_virtual_environment_vm"
        };
        let node = NODES[i % 3];
        let (actions, before, after) = match i {
            0..=29 => (
                json!(["create"]),
                Value::Null,
                guest(i, container, node, 2, 4096, 32),
            ),
            30..=39 => (
                json!(["update"]),
                guest(i, container, node, 2, 2048, 16),
                guest(i, container, node, 4, 8192, 32),
            ),
            _ => (
                json!(["delete"]),
                guest(i, container, node, 2, 2048, 16),
                Value::Null,
            ),
        };
        changes.push(
            json!({"address": format!("{t}.g{i}"), "mode": "managed", "type": t,
            "name": format!("g{i}"), "provider_name": "registry.opentofu.org/bpg/proxmox",
            "change": {"actions": actions, "before": before, "after": after,
                       "after_unknown": {}}}),
        );
    }
    json!({"format_version": "1.2", "resource_changes": changes}).to_string()
}

fn cluster() -> Cluster {
    let mut c = Cluster::homelab().token(TOKEN, SECRET, &[("/", "PVEAuditor")]);
    c.version = "9.1.2".into();
    for n in NODES {
        c.nodes.insert(n.into(), "online".into());
        c.hardware.insert(
            n.into(),
            NodeHardware {
                mem_total: 256 * GIB,
                mem_used: 64 * GIB,
                cpus: 64,
            },
        );
        c.bridges
            .insert(n.into(), ["vmbr0".to_string(), "vmbr1".to_string()].into());
    }
    for s in &mut c.storages {
        s.total = 4096 * GIB;
        if s.id == "nfs-images" {
            s.content.push("rootdir".into());
        }
    }
    // The cluster's 50 guests: the 20 the plan resizes or deletes, and 30 it does not know.
    c.guests.clear();
    for i in 30..50 {
        c = if i % 5 == 4 {
            c.container(1000 + i as u64, &format!("g{i}"), NODES[i % 3])
        } else {
            c.guest(1000 + i as u64, &format!("g{i}"), NODES[i % 3], false)
        };
    }
    for i in 0..30u64 {
        c = c.guest(
            2000 + i,
            &format!("other{i}"),
            NODES[i as usize % 3],
            i == 0,
        );
    }
    assert_eq!(c.guests.len(), 50);
    c
}

/// `planbot preflight` (the binary) on the same plan and cluster: its wall time per run.
fn cli_runs(url: &str, plan_json: &str, runs: usize) -> Vec<Duration> {
    let dir = tempfile::tempdir().unwrap();
    let plan_file = dir.path().join("plan.json");
    std::fs::write(&plan_file, plan_json).unwrap();
    let config = dir.path().join("planbot.toml");
    std::fs::write(
        &config,
        format!(
            r#"data_dir = "{data}"
public_url = "https://planbot.example.com"
fingerprint_key = "a-long-random-server-secret-0123456789"

[gitlab]
url = "https://gitlab.example.com"
token = "glpat-not-used-by-the-preflight-0000"
webhook_secret = "hook-secret-5f3a"
projects = ["infra/homelab"]

[proxmox]
endpoint = "{url}"
api_token = "{TOKEN}={SECRET}"
"#,
            data = dir.path().join("data").display(),
        ),
    )
    .unwrap();
    (0..runs)
        .map(|_| {
            let t = Instant::now();
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_planbot"))
                .arg("preflight")
                .arg(&plan_file)
                .arg("--config")
                .arg(&config)
                .args(["--format", "json"])
                .env_remove("PROXMOX_VE_ENDPOINT")
                .env_remove("PROXMOX_VE_API_TOKEN")
                .env_remove("PM_VE_ENDPOINT")
                .env_remove("PM_VE_API_TOKEN")
                .output()
                .unwrap();
            let took = t.elapsed();
            assert_eq!(
                out.status.code(),
                Some(0),
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            took
        })
        .collect()
}

fn summary(mut times: Vec<Duration>) -> String {
    times.sort();
    format!(
        "min {:?}, median {:?}, max {:?}",
        times[0],
        times[times.len() / 2],
        times[times.len() - 1]
    )
}

fn main() {
    let bench = std::env::args().any(|a| a == "--bench");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let fake = FakeProxmox::start(cluster()).await;
        let plan = Plan::from_json(plan_json().as_bytes()).expect("a plan");
        let ep = || {
            let mut ep = ProxmoxEndpoint::new(&fake.url, format!("{TOKEN}={SECRET}"));
            ep.timeout = Duration::from_secs(10);
            ep
        };
        let pf = planbot::flows::preflight::for_plan(Some(ep()), &plan).await;
        assert!(pf.failed.is_none(), "{}", pf.note);
        let calls = fake.requests();
        let mut by_endpoint: BTreeMap<String, usize> = BTreeMap::new();
        for (_, path) in &calls {
            let p = path.split('?').next().unwrap_or_default();
            let shape: Vec<&str> = p
                .trim_start_matches("/api2/json/")
                .split('/')
                .enumerate()
                .map(|(i, seg)| match (i, seg) {
                    (1, _) if p.contains("/nodes/") => "{node}",
                    (3, _) if p.contains("/storage/") && p.ends_with("/status") => "{storage}",
                    (3, _) if p.contains("/network/") => "{iface}",
                    _ => seg,
                })
                .collect();
            *by_endpoint.entry(shape.join("/")).or_default() += 1;
        }
        println!(
            "preflight of 50 guests on 3 nodes: {} API calls, {} findings, capacity rows: {} nodes, {} storages",
            calls.len(),
            pf.findings.len(),
            pf.capacity.as_ref().map_or(0, |c| c.nodes.len()),
            pf.capacity.as_ref().map_or(0, |c| c.storages.len()),
        );
        for (endpoint, n) in &by_endpoint {
            println!("  {n:>3}  GET /{endpoint}");
        }
        let runs = if bench { 30 } else { 1 };
        let mut times = Vec::new();
        for _ in 0..runs {
            let t = Instant::now();
            let pf = planbot::flows::preflight::for_plan(Some(ep()), &plan).await;
            times.push(t.elapsed());
            assert!(pf.failed.is_none());
        }
        println!("wall time over {runs} preflights: {}", summary(times));
        let url = fake.url.clone();
        let cli = tokio::task::spawn_blocking(move || cli_runs(&url, &plan_json(), runs))
            .await
            .unwrap();
        println!(
            "wall time over {runs} runs of `planbot preflight plan.json --config planbot.toml --format json`: {}",
            summary(cli)
        );
    });
}
