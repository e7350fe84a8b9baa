//! Argument parsing, through a wrapper shaped like the `narad` binary's top level.

use clap::{CommandFactory, Parser};

use crate::topic::TopicCmd;
use crate::*;

#[derive(Debug, Parser)]
#[command(name = "narad")]
struct Cli {
    #[command(subcommand)]
    cmd: Top,
}

#[derive(Debug, clap::Subcommand)]
enum Top {
    Server {
        #[command(subcommand)]
        cmd: ServerCmd,
    },
    Serve,
    Version,
    #[command(flatten)]
    Client(Box<Command>),
}

#[derive(Debug, clap::Subcommand)]
enum ServerCmd {
    Start,
    Report(ReportArgs),
}

fn parse(args: &[&str]) -> Result<Command, clap::Error> {
    let mut v = vec!["narad"];
    v.extend_from_slice(args);
    match Cli::try_parse_from(v)?.cmd {
        Top::Client(c) => Ok(*c),
        other => panic!("not a client command: {other:?}"),
    }
}

#[test]
fn clap_definition_is_valid() {
    Cli::command().debug_assert();
}

#[test]
fn topic_add_and_connection_flags() {
    let c = parse(&[
        "topic",
        "add",
        "orders",
        "--partitions",
        "6",
        "--retention",
        "forever",
        "--visibility",
        "45s",
        "--max-in-flight",
        "10",
        "--max-acked-ahead",
        "20",
        "-s",
        "http://h:1",
        "-u",
        "bob",
        "-p",
        "pw",
    ])
    .unwrap();
    let Command::Topic {
        cmd: TopicCmd::Add(a),
        conn,
    } = c
    else {
        panic!("{c:?}")
    };
    assert_eq!(a.name, "orders");
    assert_eq!(a.partitions, Some(6));
    assert_eq!(a.retention.as_deref(), Some("forever"));
    assert_eq!(a.max_acked_ahead, Some(20));
    assert_eq!(conn.server.as_deref(), Some("http://h:1"));
    assert_eq!(conn.user.as_deref(), Some("bob"));
    assert_eq!(conn.password.as_deref(), Some("pw"));
    let r = topic::create_request(&a).unwrap();
    assert_eq!(r.retention_ms, Some(0));
    assert_eq!(r.visibility_timeout_ms, Some(45_000));

    // Connection flags also before the subcommand.
    let c = parse(&["topic", "--server", "http://x:2", "ls", "--json"]).unwrap();
    let Command::Topic {
        cmd: TopicCmd::Ls { json },
        conn,
    } = c
    else {
        panic!()
    };
    assert!(json);
    assert_eq!(conn.server.as_deref(), Some("http://x:2"));

    // --delay needs --parent.
    assert!(parse(&["topic", "add", "x", "--delay", "1h"]).is_err());
    let c = parse(&["topic", "add", "x", "--parent", "orders", "--delay", "1h"]).unwrap();
    let Command::Topic {
        cmd: TopicCmd::Add(a),
        ..
    } = c
    else {
        panic!()
    };
    assert_eq!(
        topic::create_request(&a).unwrap().fanout_delay_ms,
        Some(3_600_000)
    );
}

#[test]
fn topic_other_subcommands() {
    assert!(matches!(
        parse(&["topic", "rm", "orders", "-f"]).unwrap(),
        Command::Topic {
            cmd: TopicCmd::Rm { force: true, .. },
            ..
        }
    ));
    assert!(matches!(
        parse(&["topic", "rm", "orders"]).unwrap(),
        Command::Topic {
            cmd: TopicCmd::Rm { force: false, .. },
            ..
        }
    ));
    assert!(matches!(
        parse(&["topic", "info", "orders"]).unwrap(),
        Command::Topic {
            cmd: TopicCmd::Info { .. },
            ..
        }
    ));
    assert!(matches!(
        parse(&[
            "topic",
            "edit",
            "orders",
            "--retention",
            "12h",
            "--partitions",
            "9"
        ])
        .unwrap(),
        Command::Topic {
            cmd: TopicCmd::Edit(_),
            ..
        }
    ));
    let c = parse(&["topic", "attach", "orders", "orders-retry", "--delay", "1h"]).unwrap();
    let Command::Topic {
        cmd: TopicCmd::Attach(a),
        ..
    } = c
    else {
        panic!()
    };
    assert_eq!(a.delay.as_deref(), Some("1h"));
    let c = parse(&[
        "topic",
        "attach",
        "orders",
        "orders-dr",
        "--remote-url",
        "https://dr:7942",
        "--remote-topic",
        "orders",
        "--remote-user",
        "repl",
        "--remote-password",
        "x",
    ])
    .unwrap();
    let Command::Topic {
        cmd: TopicCmd::Attach(a),
        ..
    } = c
    else {
        panic!()
    };
    assert_eq!(a.remote_topic.as_deref(), Some("orders"));
    assert!(parse(&["topic", "attach", "a", "b", "--remote-topic", "t"]).is_err());
    assert!(parse(&[
        "topic",
        "attach",
        "a",
        "b",
        "--delay",
        "1h",
        "--remote-url",
        "http://x"
    ])
    .is_err());
    assert!(matches!(
        parse(&["topic", "detach", "orders", "orders-retry"]).unwrap(),
        Command::Topic {
            cmd: TopicCmd::Detach { .. },
            ..
        }
    ));
    assert!(matches!(
        parse(&["topic", "children", "orders"]).unwrap(),
        Command::Topic {
            cmd: TopicCmd::Children { .. },
            ..
        }
    ));
}

#[test]
fn topic_queue_administration() {
    for (cmd, want) in [("pause", "orders"), ("resume", "orders")] {
        match parse(&["topic", cmd, want]).unwrap() {
            Command::Topic {
                cmd: TopicCmd::Pause { name } | TopicCmd::Resume { name },
                ..
            } => assert_eq!(name, want),
            other => panic!("{other:?}"),
        }
    }
    assert!(parse(&["topic", "pause"]).is_err(), "a topic is required");

    // Purge asks unless -f/--force, like rm.
    assert!(matches!(
        parse(&["topic", "purge", "orders"]).unwrap(),
        Command::Topic {
            cmd: TopicCmd::Purge {
                force: false,
                json: false,
                ..
            },
            ..
        }
    ));
    assert!(matches!(
        parse(&["topic", "purge", "orders", "-f", "--json"]).unwrap(),
        Command::Topic {
            cmd: TopicCmd::Purge {
                force: true,
                json: true,
                ..
            },
            ..
        }
    ));
    assert!(matches!(
        parse(&["topic", "purge", "orders", "--force"]).unwrap(),
        Command::Topic {
            cmd: TopicCmd::Purge { force: true, .. },
            ..
        }
    ));

    let seek = |args: &[&str]| -> Result<String, clap::Error> {
        let mut v = vec!["topic", "seek", "orders"];
        v.extend_from_slice(args);
        match parse(&v)? {
            Command::Topic {
                cmd: TopicCmd::Seek(a),
                ..
            } => Ok(serde_json::to_string(&topic::seek_request(&a)).unwrap()),
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(
        seek(&["--partition", "1", "--offset", "42"]).unwrap(),
        r#"{"partition":1,"offset":42}"#
    );
    assert_eq!(
        seek(&["--timestamp", "1767225600"]).unwrap(),
        r#"{"timestamp":1767225600}"#
    );
    assert_eq!(
        seek(&["--timestamp", "1767225600", "--partition", "2"]).unwrap(),
        r#"{"partition":2,"timestamp":1767225600}"#
    );
    // RFC 3339, any offset, to the second (rounded down).
    for t in ["2026-01-01T00:00:00Z", "2026-01-01T01:00:00.999+01:00"] {
        assert_eq!(
            seek(&["--timestamp", t]).unwrap(),
            r#"{"timestamp":1767225600}"#,
            "{t}"
        );
    }
    let Command::Topic {
        cmd: TopicCmd::Seek(a),
        ..
    } = parse(&["topic", "seek", "orders", "--timestamp", "0", "--json"]).unwrap()
    else {
        panic!()
    };
    assert!(a.json);
    // Exactly one of --offset and --timestamp; --offset needs --partition.
    for bad in [
        &[][..],
        &["--partition", "1"],
        &["--offset", "42"],
        &["--partition", "1", "--offset", "42", "--timestamp", "1"],
        &["--timestamp", "2026-01-01"],
        &["--timestamp", "1969-12-31T23:59:59Z"],
        &["--timestamp", "-5"],
        &["--partition", "-1", "--offset", "4"],
    ] {
        assert!(seek(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn pub_sub_replay_bench() {
    let c = parse(&[
        "pub",
        "orders",
        "hello",
        "--key",
        "k1",
        "--partition",
        "2",
        "--count",
        "5",
        "--rate",
        "100",
        "--attr",
        "traceparent=00-1=2",
        "--attr",
        "empty=",
    ])
    .unwrap();
    let Command::Pub(a) = c else { panic!() };
    assert_eq!(
        a.attrs,
        [
            ("traceparent".to_string(), "00-1=2".to_string()),
            ("empty".to_string(), String::new())
        ]
    );
    assert!(parse(&["pub", "orders", "x", "--attr", "novalue"]).is_err());
    let Command::Pub(d) = parse(&["pub", "orders", "x", "--delay", "90s"]).unwrap() else {
        panic!()
    };
    assert_eq!(d.delay.as_deref(), Some("90s"));
    assert!(parse(&["pub", "orders", "x", "--delay", "16m"]).is_err());
    assert!(parse(&["pub", "orders", "x", "--delay", "soon"]).is_err());
    assert!(parse(&["pub", "orders", "x", "--attr", "=v"]).is_err());
    assert_eq!(a.msg.as_deref(), Some("hello"));
    assert_eq!(a.key.as_deref(), Some("k1"));
    assert_eq!(a.partition, Some(2));
    assert_eq!(a.count, 5);
    assert_eq!(a.rate, Some(100.0));
    assert_eq!(publish::read_message(&a).unwrap(), b"hello");
    assert!(parse(&["pub", "orders", "hello", "--file", "x"]).is_err());
    assert!(parse(&["pub", "orders", "x", "--count", "0"]).is_err());
    let Command::Pub(a) = parse(&["pub", "orders", ""]).unwrap() else {
        panic!()
    };
    assert!(publish::read_message(&a).is_err());

    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("m.bin");
    std::fs::write(&f, [0u8, 1, 2]).unwrap();
    let Command::Pub(a) = parse(&["pub", "orders", "--file", f.to_str().unwrap()]).unwrap() else {
        panic!()
    };
    assert_eq!(publish::read_message(&a).unwrap(), vec![0, 1, 2]);

    let Command::Sub(a) =
        parse(&["sub", "orders", "--partition", "1", "--raw", "--no-ack"]).unwrap()
    else {
        panic!()
    };
    assert!(a.raw && a.no_ack && !a.peek);
    assert_eq!(a.partition, Some(1));
    let Command::Sub(a) =
        parse(&["sub", "orders", "--peek", "--partition", "0", "--from", "5"]).unwrap()
    else {
        panic!()
    };
    assert!(a.peek);
    assert_eq!(a.from, Some(5));
    assert!(
        parse(&["sub", "orders", "--from", "5"]).is_err(),
        "--from needs --peek"
    );

    let Command::Replay(a) = parse(&[
        "replay",
        "orders",
        "--partition",
        "0",
        "--from",
        "3",
        "--to",
        "9",
        "--raw",
    ])
    .unwrap() else {
        panic!()
    };
    assert_eq!(
        (a.partition, a.from, a.to, a.raw),
        (0, Some(3), Some(9), true)
    );
    assert!(
        parse(&["replay", "orders"]).is_err(),
        "--partition is required"
    );

    let Command::Bench(a) = parse(&[
        "bench",
        "b",
        "--count",
        "100",
        "--size",
        "1024",
        "--workers",
        "4",
        "--consume",
    ])
    .unwrap() else {
        panic!()
    };
    assert_eq!(
        (a.count, a.size, a.workers, a.consume),
        (100, 1024, 4, true)
    );
    let Command::Bench(a) = parse(&["bench", "b"]).unwrap() else {
        panic!()
    };
    assert_eq!(
        (a.count, a.size, a.workers, a.consume),
        (10_000, 256, 16, false)
    );
    assert!(parse(&["bench", "b", "--size", "2000000"]).is_err());
}

#[test]
fn user_cluster_ctx() {
    let c = parse(&[
        "user",
        "add",
        "billing",
        "--user-password",
        "pw",
        "--grant",
        "produce:orders-*,audit",
        "--grant",
        "admin",
    ])
    .unwrap();
    let Command::User {
        cmd:
            user::UserCmd::Add {
                name,
                user_password,
                grants,
                ..
            },
        ..
    } = c
    else {
        panic!()
    };
    assert_eq!(
        (name.as_str(), user_password.as_deref()),
        ("billing", Some("pw"))
    );
    assert_eq!(grants.len(), 2);
    assert_eq!(grants[0].patterns, vec!["orders-*", "audit"]);
    assert!(grants[1].patterns.is_empty());
    assert!(
        parse(&["user", "add", "x"]).is_err(),
        "--user-password is required"
    );
    assert!(
        parse(&["user", "grant", "x"]).is_err(),
        "a grant or --none is required"
    );
    assert!(parse(&["user", "grant", "x", "--none"]).is_ok());
    let c = parse(&[
        "user",
        "passwd",
        "bob",
        "--current",
        "a",
        "--new",
        "b",
        "-u",
        "bob",
        "-p",
        "a",
    ])
    .unwrap();
    let Command::User {
        cmd: user::UserCmd::Passwd { current, new, .. },
        conn,
    } = c
    else {
        panic!()
    };
    assert_eq!((current.as_deref(), new.as_deref()), (Some("a"), Some("b")));
    assert_eq!(conn.password.as_deref(), Some("a"));
    assert!(parse(&["user", "ls"]).is_ok());
    assert!(parse(&["user", "rm", "bob"]).is_ok());

    assert!(parse(&["cluster", "members"]).is_ok());
    assert!(parse(&["cluster", "moves"]).is_ok());
    let c = parse(&["cluster", "decommission", "narad-3", "--cancel"]).unwrap();
    assert!(matches!(
        c,
        Command::Cluster {
            cmd: cluster::ClusterCmd::Decommission { cancel: true, .. },
            ..
        }
    ));

    let c = parse(&[
        "ctx",
        "add",
        "prod",
        "--server",
        "http://h:1",
        "--user",
        "u",
        "--password",
        "p",
    ])
    .unwrap();
    assert!(matches!(
        c,
        Command::Ctx {
            cmd: ctx::CtxCmd::Add { .. }
        }
    ));
    assert!(parse(&["ctx", "select", "prod"]).is_ok());
    assert!(parse(&["ctx", "ls"]).is_ok());
    assert!(parse(&["ctx", "rm", "prod"]).is_ok());
}

#[test]
fn server_report_args() {
    let cli =
        Cli::try_parse_from(["narad", "server", "report", "-s", "http://h:1", "--json"]).unwrap();
    let Top::Server {
        cmd: ServerCmd::Report(r),
    } = cli.cmd
    else {
        panic!()
    };
    assert!(r.json);
    assert_eq!(r.conn.server.as_deref(), Some("http://h:1"));
}
