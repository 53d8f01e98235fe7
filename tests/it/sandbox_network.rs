//! The engine's network by allow-list, for every socket family and protocol: MR code in the
//! real sandbox reaches a listener on a port the sandbox blocks over none of TCP, MPTCP, SCTP,
//! UDP, raw, packet, UNIX (pathname or abstract), netlink, vsock or `SOCK_SEQPACKET`. Each case
//! first shows the attack working without the layer that stops it (Landlock alone for the
//! families only the seccomp allow-list refuses — MPTCP reached a port Landlock blocks for
//! TCP), then refused in the sandbox. Then the filter alone, call by call, against the kernel's
//! own answers.

use crate::isolation::{bash, start_bash, Confined, Job, Ran};
use planbot::capabilities::engine::Limits;
use planbot::capabilities::namespaces::engine_filters;
use std::net::{TcpListener, UdpSocket};
use std::os::unix::net::UnixListener;

/// Perl (as every Debian has it) with `out`, which prints one line and ends the script.
fn perl(body: &str) -> String {
    format!("exec perl -MSocket -e '$| = 1; sub out {{ print \"@_\\n\"; exit 0 }} {body}'")
}

/// A connect over `family`/`ty`/`protocol` to `addr` (a Perl expression for the sockaddr).
fn connect(family: i32, ty: i32, protocol: i32, addr: &str) -> String {
    perl(&format!(
        "socket(S, {family}, {ty}, {protocol}) or out \"socket: $!\"; \
         connect(S, {addr}) or out \"connect: $!\"; out \"connected\";"
    ))
}

fn inet(port: u16) -> String {
    format!("pack_sockaddr_in({port}, inet_aton(\"127.0.0.1\"))")
}

/// What the test checks after the run without the layer, beside the script's own words.
enum Arrives<'a> {
    /// Nothing more.
    Nothing,
    /// The datagram `payload` reached the UDP listener.
    Datagram(&'a UdpSocket, &'static str),
}

/// One family: its script, how it runs without the layer that stops it, what it says there
/// (`None`: whatever the kernel has, but not a refusal by the filter), and what it says in
/// the sandbox.
struct Case<'a> {
    family: &'static str,
    script: String,
    without: Confined<'a>,
    works: Option<&'static str>,
    arrives: Arrives<'a>,
    refused: &'static str,
}

const SECCOMP: &str = "socket: Operation not permitted";

/// What planbot's loopback traffic carries in [`Traffic`].
const TRAFFIC: &str = "planbot-loopback-secret";

/// Datagrams of [`TRAFFIC`] between two loopback sockets of this process, every few
/// milliseconds until dropped: the traffic a packet capture on `lo` would see.
struct Traffic {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Traffic {
    fn start() -> Traffic {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let sink = UdpSocket::bind("127.0.0.1:0").unwrap();
        let to = sink.local_addr().unwrap();
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let from = UdpSocket::bind("127.0.0.1:0").unwrap();
            sink.set_nonblocking(true).unwrap();
            let mut buf = [0u8; 64];
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                from.send_to(TRAFFIC.as_bytes(), to).unwrap();
                while sink.recv(&mut buf).is_ok() {}
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        });
        Traffic {
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Traffic {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

#[tokio::test]
async fn mr_code_reaches_a_blocked_listener_over_no_socket_family() {
    let job = Job::new();
    let policy = job.policy();
    let iso = job.isolation(Limits::default());
    // Listeners on ports the sandbox blocks (the job's policy allows none of them).
    let tcp = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = tcp.local_addr().unwrap().port();
    let tcp6 = TcpListener::bind("[::1]:0").unwrap();
    let port6 = tcp6.local_addr().unwrap().port();
    let udp = UdpSocket::bind("127.0.0.1:0").unwrap();
    udp.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    let udp_port = udp.local_addr().unwrap().port();
    // planbot's surroundings: a UNIX socket outside the view and an abstract one.
    let outside = tempfile::tempdir().unwrap();
    let path = outside.path().join("planbot.sock");
    let _unix = UnixListener::bind(&path).unwrap();
    let name = format!("planbot-test-{}", std::process::id());
    let _abstract = {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        UnixListener::bind_addr(&addr).unwrap()
    };
    let lo = std::fs::read_to_string("/sys/class/net/lo/ifindex").unwrap();
    let lo: i32 = lo.trim().parse().unwrap();
    // planbot's own loopback traffic, going on while the cases run (what a capture would see).
    let traffic = Traffic::start();
    let landlock = || Confined::LandlockOnly(&policy);
    let cases = vec![
        Case {
            family: "TCP",
            script: connect(2, 1, 0, &inet(port)),
            without: Confined::Nothing,
            works: Some("connected"),
            arrives: Arrives::Nothing,
            refused: "connect: Permission denied",
        },
        Case {
            family: "TCP Fast Open (sendto with MSG_FASTOPEN, no connect)",
            script: perl(&format!(
                "socket(S, 2, 1, 0) or out \"socket: $!\"; \
                 defined(send(S, \"x\", 0x20000000, {})) or out \"send: $!\"; out \"sent\";",
                inet(port)
            )),
            without: Confined::Nothing,
            works: Some("sent"),
            arrives: Arrives::Nothing,
            refused: "send: Permission denied",
        },
        Case {
            family: "TCP with TCP_FASTOPEN_CONNECT",
            script: perl(&format!(
                "socket(S, 2, 1, 0) or out \"socket: $!\"; setsockopt(S, 6, 30, 1) or out \"setsockopt: $!\"; \
                 connect(S, {}) or out \"connect: $!\"; out \"connected\";",
                inet(port)
            )),
            without: Confined::Nothing,
            works: Some("connected"),
            arrives: Arrives::Nothing,
            refused: "connect: Permission denied",
        },
        Case {
            family: "MPTCP connect",
            script: connect(2, 1, 262, &inet(port)),
            without: landlock(),
            works: Some("connected"),
            arrives: Arrives::Nothing,
            refused: SECCOMP,
        },
        Case {
            family: "MPTCP over IPv6 connect",
            script: connect(
                10,
                1,
                262,
                &format!("pack_sockaddr_in6({port6}, Socket::inet_pton(10, \"::1\"))"),
            ),
            without: landlock(),
            works: Some("connected"),
            arrives: Arrives::Nothing,
            refused: SECCOMP,
        },
        Case {
            family: "MPTCP bind and listen",
            script: perl(&format!(
                "socket(S, 2, 1, 262) or out \"socket: $!\"; \
                 bind(S, {}) or out \"bind: $!\"; listen(S, 5) or out \"listen: $!\"; out \"listening\";",
                inet(0)
            )),
            without: landlock(),
            works: Some("listening"),
            arrives: Arrives::Nothing,
            refused: SECCOMP,
        },
        Case {
            family: "SCTP",
            script: connect(2, 1, 132, &inet(port)),
            without: landlock(),
            works: None,
            arrives: Arrives::Nothing,
            refused: SECCOMP,
        },
        Case {
            family: "UDP",
            script: perl(&format!(
                "socket(S, 2, 2, 0) or out \"socket: $!\"; \
                 send(S, \"probe-udp\", 0, {}) or out \"send: $!\"; out \"sent\";",
                inet(udp_port)
            )),
            without: landlock(),
            works: Some("sent"),
            arrives: Arrives::Datagram(&udp, "probe-udp"),
            refused: SECCOMP,
        },
        Case {
            family: "raw (SOCK_RAW)",
            script: perl(&format!(
                "socket(S, 2, 3, 17) or out \"socket: $!\"; my $d = \"probe-raw\"; \
                 send(S, pack(\"nnnn\", 40000, {udp_port}, 8 + length $d, 0) . $d, 0, {}) or out \"send: $!\"; out \"sent\";",
                inet(0)
            )),
            without: landlock(),
            works: Some("sent"),
            arrives: Arrives::Datagram(&udp, "probe-raw"),
            refused: SECCOMP,
        },
        Case {
            family: "packet (AF_PACKET)",
            script: perl(&format!(
                "socket(S, 17, 3, unpack(\"S\", pack(\"n\", 3))) or out \"socket: $!\"; \
                 bind(S, pack(\"SniSCCa8\", 17, 3, {lo}, 0, 0, 0, \"\\0\" x 8)) or out \"bind: $!\"; \
                 while (1) {{ defined(recv(S, my $f, 65536, 0)) or out \"recv: $!\"; out \"captured\" if index($f, \"{TRAFFIC}\") >= 0 }}"
            )),
            without: landlock(),
            works: Some("captured"),
            arrives: Arrives::Nothing,
            refused: SECCOMP,
        },
        Case {
            family: "UNIX pathname socket outside the view",
            script: connect(1, 1, 0, &format!("pack_sockaddr_un(\"{}\")", path.display())),
            without: landlock(),
            works: Some("connected"),
            arrives: Arrives::Nothing,
            refused: "connect: No such file or directory",
        },
        Case {
            family: "abstract UNIX socket",
            script: connect(1, 1, 0, &format!("pack_sockaddr_un(\"\\0{name}\")")),
            without: Confined::Nothing,
            works: Some("connected"),
            arrives: Arrives::Nothing,
            refused: "connect: Operation not permitted",
        },
        Case {
            family: "netlink",
            script: perl(
                "socket(S, 16, 3, 0) or out \"socket: $!\"; \
                 send(S, pack(\"LSSLLCx3\", 20, 18, 0x301, 1, 0, 0), 0, pack(\"SxxLL\", 16, 0, 0)) or out \"send: $!\"; \
                 defined(recv(S, my $b, 65536, 0)) or out \"recv: $!\"; out(\"answered\") if length $b;",
            ),
            without: landlock(),
            works: Some("answered"),
            arrives: Arrives::Nothing,
            refused: SECCOMP,
        },
        Case {
            family: "vsock",
            script: perl(
                "socket(S, 40, 1, 0) or out \"socket: $!\"; \
                 bind(S, pack(\"SSLLCx3\", 40, 0, 0xffffffff, 0xffffffff, 0)) or out \"bind: $!\"; \
                 listen(S, 5) or out \"listen: $!\"; out \"listening\";",
            ),
            without: landlock(),
            works: Some("listening"),
            arrives: Arrives::Nothing,
            refused: SECCOMP,
        },
        Case {
            family: "AF_INET SOCK_SEQPACKET",
            script: connect(2, 5, 0, &inet(port)),
            without: landlock(),
            works: None,
            arrives: Arrives::Nothing,
            refused: SECCOMP,
        },
        Case {
            family: "SMC over AF_INET (IPPROTO_SMC)",
            script: connect(2, 1, 256, &inet(port)),
            without: landlock(),
            works: None,
            arrives: Arrives::Nothing,
            refused: SECCOMP,
        },
        Case {
            family: "MPTCP under its x32 system call number",
            script: perl(
                "my $fd = syscall(0x40000000 | 41, 2, 1, 262); out($fd < 0 ? \"socket: $!\" : \"made\");",
            ),
            without: landlock(),
            works: None,
            arrives: Arrives::Nothing,
            refused: SECCOMP,
        },
    ];

    let mut report = Vec::new();
    for case in cases {
        let family = case.family;
        let without = bash(&case.script, case.without, job.work.path(), None).await;
        let line = first_line(&without);
        match case.works {
            Some(works) => assert_eq!(
                line, works,
                "{family}: without its layer the attack works here (else this case proves \
                 nothing): {}",
                without.stderr
            ),
            None => assert!(
                !line.contains("Operation not permitted"),
                "{family}: the kernel itself refuses with EPERM, so the filter's refusal \
                 would prove nothing: {line}"
            ),
        }
        if let Arrives::Datagram(listener, payload) = case.arrives {
            let mut buf = [0u8; 64];
            let n = listener
                .recv(&mut buf)
                .unwrap_or_else(|e| panic!("{family}: the datagram did not arrive: {e}"));
            assert_eq!(&buf[..n], payload.as_bytes(), "{family}");
        }
        let inside = bash(
            &case.script,
            Confined::Isolated(&policy, &iso),
            job.work.path(),
            None,
        )
        .await;
        assert_eq!(
            first_line(&inside),
            case.refused,
            "{family}: in the sandbox: {}",
            inside.stderr
        );
        report.push(format!("{family}: {line} -> {}", first_line(&inside)));
    }
    // What is allowed still works in the sandbox: glibc's getaddrinfo (its netlink socket is
    // refused) resolves a name, and a UNIX socket of the job's own serves (as the providers'
    // gRPC does).
    let allowed = bash(
        r#"getent ahosts localhost | head -1
perl -MIO::Socket::UNIX -e '$l = IO::Socket::UNIX->new(Local => "own.sock", Listen => 1) or die "listen: $!"; $c = IO::Socket::UNIX->new(Peer => "own.sock") or die "connect: $!"; print "own socket: ok\n"'"#,
        Confined::Isolated(&policy, &iso),
        job.work.path(),
        None,
    )
    .await;
    assert!(
        allowed.stdout.contains("127.0.0.1") || allowed.stdout.contains("::1"),
        "{}{}",
        allowed.stdout,
        allowed.stderr
    );
    assert!(
        allowed.stdout.contains("own socket: ok"),
        "{}{}",
        allowed.stdout,
        allowed.stderr
    );
    drop(traffic);
    // What this kernel answered, for the record (`--nocapture`).
    println!("{}", report.join("\n"));
    // Nothing the sandboxed runs sent arrived.
    udp.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 64];
    assert!(udp.recv(&mut buf).is_err(), "a datagram from the sandbox");
}

/// A TCP listener of MR code: socket, (a bind, when `bind` names the address), `listen()`, then
/// the port `getsockname` gives, held until the test closes the FIFO `knocked`.
fn listener_script(family: i32, bind: Option<&str>) -> String {
    let bind = bind
        .map(|addr| format!("bind(S, {addr}) and out \"bound: the case proves nothing\"; "))
        .unwrap_or_default();
    perl(&format!(
        "open(my $k, \"<\", \"knocked\") or out \"knocked: $!\"; \
         socket(S, {family}, 1, 0) or out \"socket: $!\"; {bind}\
         my $said = listen(S, 5) ? \"listening\" : \"listen: $!\"; \
         my $a = getsockname(S); \
         my $port = sockaddr_family($a) == AF_INET ? (unpack_sockaddr_in($a))[0] : (unpack_sockaddr_in6($a))[0]; \
         print \"$said port=$port\\n\"; <$k>; exit 0;"
    ))
}

/// Runs a [`listener_script`] confined as asked and, while it holds its socket, knocks from
/// outside (this test process, on loopback over IPv4 and IPv6) on the port it got: its line,
/// and whether a connection was accepted.
async fn listen_and_knock(
    script: &str,
    how: Confined<'_>,
    cwd: &std::path::Path,
) -> (String, bool) {
    use tokio::io::AsyncBufReadExt;
    // The script holds its socket until this test has knocked: it opens the FIFO `knocked`
    // first and, once it has said its line, reads it to its end, which comes when the test
    // closes its end (held open read-write, so that neither side's open waits for the other).
    let fifo = cwd.join("knocked");
    let _ = std::fs::remove_file(&fifo);
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o666)).unwrap();
    let held = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo)
        .unwrap();
    let mut child = start_bash(script, how, cwd);
    let stdout = child.stdout.take().unwrap();
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let line = tokio::time::timeout(std::time::Duration::from_secs(60), lines.next_line())
        .await
        .expect("the script says what it got")
        .unwrap()
        .unwrap_or_default();
    let port: u16 = line
        .rsplit_once("port=")
        .and_then(|(_, p)| p.trim().parse().ok())
        .unwrap_or(0);
    let mut reached = false;
    if port != 0 {
        for host in ["127.0.0.1", "::1"] {
            if let Ok(Ok(_)) = tokio::time::timeout(
                std::time::Duration::from_secs(10),
                tokio::net::TcpStream::connect((host, port)),
            )
            .await
            {
                reached = true;
            }
        }
    }
    drop(held);
    tokio::time::timeout(std::time::Duration::from_secs(60), child.wait())
        .await
        .expect("the script ends once the FIFO closes")
        .unwrap();
    (line, reached)
}

#[tokio::test]
async fn mr_code_cannot_open_a_tcp_listener_and_unix_sockets_still_listen() {
    let job = Job::new();
    let policy = job.policy();
    let iso = job.isolation(Limits::default());
    let cwd = job.work.path();
    // A port the sandbox's Landlock rules refuse to bind.
    let free = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = free.local_addr().unwrap().port();
    drop(free);
    let inet6 = |port: u16| format!("pack_sockaddr_in6({port}, Socket::inet_pton(10, \"::\"))");
    // listen() on a TCP socket never bound (or whose bind was refused) binds it to an
    // ephemeral port of every interface itself: under Landlock alone (what planbot had before
    // the guard) a client outside the sandbox reaches it.
    let tcp = [
        ("IPv4, listen() without bind", listener_script(2, None)),
        ("IPv6, listen() without bind", listener_script(10, None)),
        (
            "IPv4, listen() after a refused bind",
            listener_script(2, Some(&inet(port))),
        ),
        (
            "IPv6, listen() after a refused bind",
            listener_script(10, Some(&inet6(port))),
        ),
    ];
    for (case, script) in &tcp {
        let (without, reached) =
            listen_and_knock(script, Confined::LandlockOnly(&policy), cwd).await;
        assert!(
            without.starts_with("listening port=") && reached,
            "{case}: under Landlock alone the listener works and is reached from outside (else \
             this case proves nothing): {without}, reached: {reached}"
        );
        let (inside, reached) =
            listen_and_knock(script, Confined::Isolated(&policy, &iso), cwd).await;
        assert_eq!(
            inside, "listen: Operation not permitted port=0",
            "{case}: in the sandbox"
        );
        assert!(
            !reached,
            "{case}: a client outside reached the sandbox's socket"
        );
    }

    // What the guard lets through answers as the kernel does: UNIX sockets listen (as the
    // providers' go-plugin servers do) and serve, the kernel's own errors stay; and MR code
    // cannot stack a seccomp listener of its own in front of planbot's.
    let listen = libc::SYS_listen;
    let seccomp = libc::SYS_seccomp;
    let serve = |addr: &str| {
        perl(&format!(
            "socket(S, 1, 1, 0) or out \"socket: $!\"; bind(S, {addr}) or out \"bind: $!\"; \
             listen(S, 5) or out \"listen: $!\"; socket(C, 1, 1, 0) or out \"socket: $!\"; \
             connect(C, {addr}) or out \"connect: $!\"; accept(A, S) or out \"accept: $!\"; \
             send(C, \"ping\\n\", 0); my $l = <A>; out \"served $l\";"
        ))
    };
    let same_as_kernel = [
        (
            "UNIX pathname socket",
            format!("rm -f own.sock; {}", serve("pack_sockaddr_un(\"own.sock\")")),
            Some("served ping"),
        ),
        (
            "abstract UNIX socket of the job's own",
            serve("pack_sockaddr_un(\"\\0planbot-listen-$$\")"),
            Some("served ping"),
        ),
        (
            "UNIX socket never bound",
            perl("socket(S, 1, 1, 0) or out \"socket: $!\"; listen(S, 5) or out \"listen: $!\"; out \"listening\";"),
            Some("listen: Invalid argument"),
        ),
        (
            "a descriptor that is not a socket",
            perl(&format!("my $r = syscall({listen}, 0, 5); out($r < 0 ? \"listen: $!\" : \"listening\");")),
            Some("listen: Socket operation on non-socket"),
        ),
        (
            "a descriptor that is not open",
            perl(&format!("my $r = syscall({listen}, 99, 5); out($r < 0 ? \"listen: $!\" : \"listening\");")),
            Some("listen: Bad file descriptor"),
        ),
    ];
    for (case, script, expected) in &same_as_kernel {
        let kernel = bash(script, Confined::LandlockOnly(&policy), cwd, None).await;
        let inside = bash(script, Confined::Isolated(&policy, &iso), cwd, None).await;
        if let Some(expected) = expected {
            assert_eq!(
                first_line(&kernel),
                *expected,
                "{case}: the kernel: {}",
                kernel.stderr
            );
        }
        assert_eq!(
            first_line(&inside),
            first_line(&kernel),
            "{case}: in the sandbox: {}",
            inside.stderr
        );
    }
    // A filter of MR code's own with a listener (SECCOMP_FILTER_FLAG_NEW_LISTENER), whose
    // supervisor would let listen() through: the kernel allows one listener per filter chain.
    let own_listener = perl(&format!(
        "my $f = pack(\"SCCL\", 6, 0, 0, 0x7fff0000); \
         my $r = syscall({seccomp}, 1, 8, pack(\"S x6 P8\", 1, $f)); \
         out($r < 0 ? \"seccomp: $!\" : \"installed\");"
    ));
    let without = bash(&own_listener, Confined::LandlockOnly(&policy), cwd, None).await;
    assert_eq!(first_line(&without), "installed", "{}", without.stderr);
    let inside = bash(&own_listener, Confined::Isolated(&policy, &iso), cwd, None).await;
    assert_eq!(
        first_line(&inside),
        "seccomp: Device or resource busy",
        "{}",
        inside.stderr
    );
}

fn first_line(ran: &Ran) -> String {
    ran.stdout.lines().next().unwrap_or("").to_string()
}

/// What a system call answers in a child under the engine's seccomp filters alone (or none):
/// 0 when it made something, else its errno. The kernel's own checks stay as they are.
fn answer(filtered: bool, nr: libc::c_long, args: [libc::c_long; 3]) -> i32 {
    let filters = engine_filters().unwrap();
    let mut pair = [0 as libc::c_int; 2];
    let out = pair.as_mut_ptr();
    // SAFETY: the child makes system calls on prepared data and exits; no allocation.
    unsafe {
        let pid = libc::fork();
        assert!(pid >= 0, "fork");
        if pid == 0 {
            if filtered {
                for f in &filters {
                    if seccompiler::apply_filter(f).is_err() {
                        libc::_exit(255);
                    }
                }
            }
            let rc = libc::syscall(nr, args[0], args[1], args[2], out);
            libc::_exit(if rc < 0 { *libc::__errno_location() } else { 0 });
        }
        let mut status = 0;
        assert_eq!(libc::waitpid(pid, &mut status, 0), pid);
        assert!(libc::WIFEXITED(status), "the child was killed: {status}");
        let code = libc::WEXITSTATUS(status);
        assert_ne!(code, 255, "the filters could not be applied");
        code
    }
}

#[test]
fn the_engine_filter_allows_only_tcp_and_unix_sockets_whatever_the_arguments_hide() {
    let (socket, pair, x32_socket) = (
        libc::SYS_socket,
        libc::SYS_socketpair,
        0x4000_0000 | libc::SYS_socket,
    );
    let flags = (libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC) as libc::c_long;
    let high: libc::c_long = 1 << 32;
    // (case, call, arguments, allowed)
    let cases: &[(&str, libc::c_long, [libc::c_long; 3], bool)] = &[
        ("TCP", socket, [2, 1, 0], true),
        ("TCP by name", socket, [2, 1, 6], true),
        (
            "TCP, non-blocking, close-on-exec",
            socket,
            [2, 1 | flags, 6],
            true,
        ),
        ("TCP over IPv6", socket, [10, 1, 0], true),
        ("UNIX stream", socket, [1, 1, 0], true),
        ("UNIX datagram", socket, [1, 2, 0], true),
        ("UNIX seqpacket", socket, [1, 5 | flags, 0], true),
        ("UNIX socketpair", pair, [1, 1, 0], true),
        ("UDP", socket, [2, 2, 0], false),
        ("UDP over IPv6", socket, [10, 2 | flags, 17], false),
        ("UDP-Lite", socket, [2, 2, 136], false),
        ("ICMP echo (ping socket)", socket, [2, 2, 1], false),
        ("MPTCP", socket, [2, 1, 262], false),
        (
            "MPTCP, non-blocking, close-on-exec",
            socket,
            [2, 1 | flags, 262],
            false,
        ),
        ("MPTCP over IPv6", socket, [10, 1, 262], false),
        (
            "MPTCP with high bits over the protocol",
            socket,
            [2, 1, high | 262],
            false,
        ),
        (
            "UDP with high bits over the family",
            socket,
            [high | 2, 2, 0],
            false,
        ),
        ("SCTP", socket, [2, 1, 132], false),
        ("SCTP, one-to-many", socket, [2, 5, 132], false),
        ("SMC over AF_INET", socket, [2, 1, 256], false),
        ("AF_SMC", socket, [43, 1, 0], false),
        ("AF_INET SOCK_SEQPACKET", socket, [2, 5, 0], false),
        ("AF_INET SOCK_DCCP", socket, [2, 6, 33], false),
        (
            "a stream with an unknown type flag",
            socket,
            [2, 1 | 0x40, 0],
            false,
        ),
        ("raw", socket, [2, 3, 255], false),
        ("raw over IPv6", socket, [10, 3, 58], false),
        ("packet", socket, [17, 3, 0x0300], false),
        ("netlink", socket, [16, 3, 0], false),
        ("vsock", socket, [40, 1, 0], false),
        ("AF_XDP", socket, [44, 3, 0], false),
        ("AF_ALG", socket, [38, 5, 0], false),
        ("TIPC", socket, [30, 5, 0], false),
        ("TCP socketpair", pair, [2, 1, 0], false),
        ("MPTCP under its x32 number", x32_socket, [2, 1, 262], false),
    ];
    let mut wrong = Vec::new();
    for (case, nr, args, allowed) in cases {
        let kernel = answer(false, *nr, *args);
        let filtered = answer(true, *nr, *args);
        let fine = if *allowed {
            filtered == kernel
        } else {
            filtered == libc::EPERM
        };
        if !fine {
            wrong.push(format!(
                "{case}: the kernel says {}, under the filter {}",
                std::io::Error::from_raw_os_error(kernel),
                std::io::Error::from_raw_os_error(filtered)
            ));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}
