//! The images on the Docker engine (SPEC §10.1): `docker/build.sh` builds the broker and
//! operator images FROM scratch (nothing is pulled) from the workspace's release binaries
//! (`NARAD_IMAGE_BINARIES=host`: the glibc binaries plus exactly their shared libraries;
//! the release default is static musl), then three broker containers form a cluster on a
//! Docker network this test creates. Under sustained produce and consume (the durability
//! ledger of `narad_e2e::load`), one container is stopped with `docker stop` (SIGTERM); the
//! other two keep answering produce `202` and deliver messages; the container starts again
//! on its volume and rejoins; after the drain nothing that got a `202` is lost.
//!
//! Every docker call is bounded in time; only the containers, network, volumes and images
//! named after this run (`narad-ci-<pid>`) are removed at the end, also on failure.
//! Without the `docker` CLI the test says so (on stderr, past the test harness's capture)
//! and passes, unless `NARAD_REQUIRE_DOCKER=1`; a CLI whose engine does not answer fails.
//! The verdict (lost, duplicates) is printed past the capture too, so CI logs show it.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use narad_e2e::load::Load;
use narad_tests::server::free_port;
use narad_tests::{eventually, json, narad_bin, Http, Method, Value};

const NODES: usize = 3;
const PRODUCERS: u32 = 8;
const CONSUMERS_PER_NODE: usize = 2;
const DRAIN: Duration = Duration::from_secs(120);
/// Most any single docker command may take (image builds included).
const DOCKER_TIMEOUT: Duration = Duration::from_secs(180);
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// Runs `docker args…`, at most `limit`; stdout, or an error with stderr.
async fn docker_within(limit: Duration, args: &[&str]) -> anyhow::Result<String> {
    let child = tokio::process::Command::new("docker")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    let out = tokio::time::timeout(limit, child.wait_with_output())
        .await
        .map_err(|_| anyhow::anyhow!("docker {} timed out after {limit:?}", args.join(" ")))??;
    anyhow::ensure!(
        out.status.success(),
        "docker {} failed ({}): {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr).trim()
    );
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

async fn docker(args: &[&str]) -> String {
    docker_within(DOCKER_TIMEOUT, args)
        .await
        .unwrap_or_else(|e| panic!("{e:#}"))
}

/// Everything this run creates, removed on drop (also when the test fails).
struct Created {
    run: String,
    containers: Vec<String>,
    network: Option<String>,
    images: Vec<String>,
}

impl Drop for Created {
    fn drop(&mut self) {
        let quiet = |args: &[&str]| {
            let _ = std::process::Command::new("timeout")
                .arg("60")
                .arg("docker")
                .args(args)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        };
        if std::thread::panicking() {
            for c in &self.containers {
                eprintln!("--- docker logs {c} (tail)");
                if let Ok(o) = std::process::Command::new("docker")
                    .args(["logs", "--tail", "40", c])
                    .output()
                {
                    eprintln!(
                        "{}{}",
                        String::from_utf8_lossy(&o.stdout),
                        String::from_utf8_lossy(&o.stderr)
                    );
                }
            }
        }
        for c in &self.containers {
            // -v: the anonymous /var/lib/narad volume of this container only.
            quiet(&["rm", "-f", "-v", c]);
        }
        if let Some(n) = &self.network {
            quiet(&["network", "rm", n]);
        }
        for i in &self.images {
            quiet(&["rmi", i]);
        }
        eprintln!("docker: removed what run {} created", self.run);
    }
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

async fn ready(http: &Http) -> anyhow::Result<()> {
    let r = http
        .request(Method::GET, "/readyz")
        .timeout(Duration::from_secs(2))
        .try_send()
        .await?;
    anyhow::ensure!(r.status == 200, "not ready: {}", r.describe());
    Ok(())
}

async fn members(http: &Http) -> anyhow::Result<Vec<Value>> {
    let r = http
        .request(Method::GET, "/v1/cluster/members")
        .timeout(Duration::from_secs(2))
        .try_send()
        .await?;
    anyhow::ensure!(r.status == 200, "{}", r.describe());
    let v: Value = serde_json::from_slice(&r.body)?;
    Ok(v["members"].as_array().cloned().unwrap_or_default())
}

/// Produces one message on `http` until a `202` (the node keeps serving).
async fn produce_ok(http: &Http, what: &str) {
    eventually(
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let r = http
                .request(Method::POST, "/v1/topics/docker-probe/produce")
                .body(format!("probe {what}"))
                .timeout(Duration::from_secs(5))
                .try_send()
                .await?;
            anyhow::ensure!(r.status == 202, "{what}: {}", r.describe());
            Ok(())
        },
    )
    .await;
}

/// A line on stderr that the test harness does not capture (CI logs show it).
fn say(line: &str) {
    let _ = writeln!(std::io::stderr(), "{line}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_build_and_a_three_container_cluster_survives_a_stopped_container() {
    let required = std::env::var("NARAD_REQUIRE_DOCKER").is_ok_and(|v| v == "1");
    if let Err(e) = std::process::Command::new("docker")
        .arg("--version")
        .output()
    {
        assert!(!required, "NARAD_REQUIRE_DOCKER=1 but no docker CLI: {e}");
        say(&format!(
            "SKIPPED images_build_and_a_three_container_cluster_survives_a_stopped_container: \
             no docker CLI ({e})"
        ));
        return;
    }
    docker_within(Duration::from_secs(30), &["version"])
        .await
        .unwrap_or_else(|e| panic!("the docker CLI is here but its engine does not answer: {e:#}"));
    let run = format!("narad-ci-{}", std::process::id());
    let tag = run.clone();
    let mut created = Created {
        run: run.clone(),
        containers: Vec::new(),
        network: None,
        images: vec![format!("narad:{tag}"), format!("narad-operator:{tag}")],
    };

    // --- Both images, from the binaries this workspace built.
    let t = Instant::now();
    let bin_dir = narad_bin().parent().unwrap().to_path_buf();
    let build = tokio::process::Command::new("bash")
        .arg(workspace().join("docker/build.sh"))
        .args(["all", &tag])
        .env("NARAD_IMAGE_BINARIES", "host")
        .env("NARAD_IMAGE_BIN_DIR", &bin_dir)
        .env("CARGO_TARGET_DIR", std::env::temp_dir().join(&run))
        .kill_on_drop(true)
        .status();
    let st = tokio::time::timeout(DOCKER_TIMEOUT, build)
        .await
        .expect("docker/build.sh timed out")
        .expect("run docker/build.sh");
    assert!(st.success(), "docker/build.sh failed: {st}");
    let _ = std::fs::remove_dir_all(std::env::temp_dir().join(&run));
    eprintln!("docker: both images built in {:?}", t.elapsed());
    for image in &created.images {
        let cfg: Value = serde_json::from_str(
            &docker(&["image", "inspect", "--format", "{{json .Config}}", image]).await,
        )
        .unwrap();
        assert_eq!(cfg["User"], "10001:10001", "{image}: {cfg}");
    }
    let cfg: Value = serde_json::from_str(
        &docker(&[
            "image",
            "inspect",
            "--format",
            "{{json .Config}}",
            &format!("narad:{tag}"),
        ])
        .await,
    )
    .unwrap();
    assert_eq!(cfg["Entrypoint"], json!(["narad"]));
    assert_eq!(
        cfg["Cmd"],
        json!([
            "server",
            "start",
            "--addr",
            "0.0.0.0:7942",
            "--data-dir",
            "/var/lib/narad"
        ])
    );
    assert!(
        cfg["ExposedPorts"].get("7942/tcp").is_some()
            && cfg["ExposedPorts"].get("7943/tcp").is_some()
    );
    assert_eq!(cfg["Volumes"], json!({"/var/lib/narad": {}}));
    // The operator image runs (no API server here: its CRD generator).
    let crds = docker(&["run", "--rm", &format!("narad-operator:{tag}"), "crdgen"]).await;
    assert!(crds.contains("name: naradclusters.narad.io"), "{crds}");
    let v = docker(&["run", "--rm", &format!("narad:{tag}"), "version"]).await;
    assert!(v.starts_with("narad "), "{v}");

    // --- Three brokers on a network of their own, API ports published on loopback.
    docker(&["network", "create", &run]).await;
    created.network = Some(run.clone());
    let names: Vec<String> = (0..NODES).map(|i| format!("{run}-{i}")).collect();
    let peers = (0..NODES)
        .map(|i| format!("n{i}@{}:7943", names[i]))
        .collect::<Vec<_>>()
        .join(",");
    let initial = (0..NODES)
        .map(|i| format!("n{i}"))
        .collect::<Vec<_>>()
        .join(",");
    let mut urls = Vec::new();
    for (i, name) in names.iter().enumerate() {
        let port = free_port();
        let envs = [
            format!("NARAD_NODE_ID=n{i}"),
            format!("NARAD_CLUSTER_ADVERTISE_ADDR={name}:7943"),
            format!("NARAD_CLUSTER_PEERS={peers}"),
            format!("NARAD_CLUSTER_INITIAL_MEMBERS={initial}"),
            "NARAD_SECURITY_ENABLED=false".into(),
            "NARAD_LOG_FORMAT=text".into(),
            // The e2e harness's failure detection (250 ms heartbeat, dead after 3 s).
            "NARAD_TEST_KNOBS=true".into(),
            format!("NARAD_TEST_HEARTBEAT_MS={}", narad_e2e::HEARTBEAT_MS),
            format!("NARAD_TEST_DEAD_AFTER_MS={}", narad_e2e::DEAD_AFTER_MS),
        ];
        let publish = format!("127.0.0.1:{port}:7942");
        let mut args = vec![
            "run",
            "-d",
            "--name",
            name,
            "--hostname",
            name,
            "--network",
            &run,
            "-p",
            &publish,
        ];
        for e in &envs {
            args.push("-e");
            args.push(e);
        }
        let image = format!("narad:{tag}");
        args.push(&image);
        created.containers.push(name.clone());
        docker(&args).await;
        urls.push(format!("http://127.0.0.1:{port}"));
    }
    let https: Vec<Http> = urls.iter().map(Http::new).collect();
    let t = Instant::now();
    for h in &https {
        eventually(READY_TIMEOUT, Duration::from_millis(200), || ready(h)).await;
    }
    eventually(READY_TIMEOUT, Duration::from_millis(200), || async {
        let m = members(&https[0]).await?;
        anyhow::ensure!(
            m.len() == NODES && m.iter().all(|m| m["status"] == "alive"),
            "members: {m:?}"
        );
        Ok(())
    })
    .await;
    eprintln!("docker: 3-container cluster ready in {:?}", t.elapsed());
    https[0]
        .create_topic(&json!({"name": "orders", "partitions": 6, "visibility_timeout_ms": 5000}))
        .await;
    https[0]
        .create_topic(&json!({"name": "docker-probe", "partitions": 3}))
        .await;

    let load = Load::start(&urls, "orders", PRODUCERS, CONSUMERS_PER_NODE);
    eventually(
        Duration::from_secs(30),
        Duration::from_millis(200),
        || async {
            let r = load.ledger.report();
            anyhow::ensure!(r.produced > 200 && r.consumed > 100, "{r}");
            Ok(())
        },
    )
    .await;
    eprintln!("docker: before the stop: {}", load.progress());

    // --- Stop one container; the two others keep serving.
    let victim = 1;
    let t = Instant::now();
    docker(&["stop", "-t", "20", &names[victim]]).await;
    eprintln!(
        "docker: {} stopped in {:?}: {}",
        names[victim],
        t.elapsed(),
        load.progress()
    );
    let consumed_at_stop = load.ledger.report().consumed;
    for (i, h) in https.iter().enumerate() {
        if i != victim {
            produce_ok(h, &format!("to n{i} while n{victim} is stopped")).await;
        }
    }
    eventually(
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let m = members(&https[0]).await?;
            let dead = m
                .iter()
                .find(|m| m["id"] == format!("n{victim}").as_str())
                .map(|m| m["status"].clone());
            anyhow::ensure!(dead == Some(json!("dead")), "n{victim} not dead yet: {m:?}");
            Ok(())
        },
    )
    .await;
    // Messages keep flowing through the two others.
    let r0 = load.ledger.report();
    eventually(
        Duration::from_secs(60),
        Duration::from_millis(200),
        || async {
            let r = load.ledger.report();
            anyhow::ensure!(
                r.produced > r0.produced + 200 && r.consumed > consumed_at_stop + 200,
                "no progress while n{victim} is stopped: {r}"
            );
            Ok(())
        },
    )
    .await;
    eprintln!("docker: served while stopped: {}", load.progress());

    // --- Start it again on its volume; it rejoins.
    let t = Instant::now();
    docker(&["start", &names[victim]]).await;
    eventually(READY_TIMEOUT, Duration::from_millis(200), || {
        ready(&https[victim])
    })
    .await;
    eventually(READY_TIMEOUT, Duration::from_millis(200), || async {
        let m = members(&https[0]).await?;
        anyhow::ensure!(
            m.len() == NODES && m.iter().all(|m| m["status"] == "alive"),
            "members: {m:?}"
        );
        Ok(())
    })
    .await;
    eprintln!(
        "docker: {} rejoined in {:?}: {}",
        names[victim],
        t.elapsed(),
        load.progress()
    );
    tokio::time::sleep(Duration::from_secs(2)).await; // load on the full cluster again
    let (report, drained) = load.finish(DRAIN).await;
    say(&format!("docker cluster: {report}"));
    say(&format!(
        "docker cluster (3 containers, one stopped and started under load): lost {}, duplicates {}",
        report.lost.len(),
        report.duplicates
    ));
    if let Err(e) = drained {
        eprintln!("drain incomplete: {e:#}");
    }
    assert!(report.produced > 0, "{report}");
    report.assert_ok();
    drop(created);
}
