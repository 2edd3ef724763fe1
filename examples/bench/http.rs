//! The HTTP layer's mode: the example service (`examples/service/`) as a process of its
//! own, `POST /orders` under load with the `Idempotency-Key` layer and without it
//! (`--no-idempotency-layer`, the same handler and flow), on a hot stock row and on many.

use super::*;

// Shared with the suites that build the example service.
#[path = "../../tests/example_service/cargo.rs"]
mod cargo;
use cargo::plain_cargo;

/// The skus seeded for the cold runs (each request takes one at random).
pub(crate) const COLD_SKUS: usize = 1000;

/// The example service's binary, built as this bench was (debug or release).
fn service_binary() -> Result<std::path::PathBuf, BoxError> {
    let release = !cfg!(debug_assertions);
    let mut build = plain_cargo();
    build.args(["build", "-q", "--example", "service", "--all-features"]);
    if release {
        build.arg("--release");
    }
    if !build.status()?.success() {
        return Err("the service example does not build".into());
    }
    let target = std::env::var("CARGO_TARGET_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|_| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("target"));
    Ok(target
        .join(if release { "release" } else { "debug" })
        .join("examples")
        .join("service"))
}

/// A running service: its process (killed on drop) and its address.
struct Service {
    child: std::process::Child,
    base: String,
}

impl Service {
    fn start(binary: &std::path::Path, db: &str, layer: bool) -> Result<Service, BoxError> {
        use std::io::BufRead;
        let mut command = std::process::Command::new(binary);
        command.args(["--listen", "127.0.0.1:0", "--db", db]);
        if !layer {
            command.arg("--no-idempotency-layer");
        }
        let mut child = command
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null())
            .spawn()?;
        let stdout = child.stdout.take().ok_or("the service's output")?;
        let mut lines = std::io::BufReader::new(stdout).lines();
        let base = loop {
            match lines.next() {
                Some(line) => {
                    if let Some(addr) = line?.strip_prefix("listening on ") {
                        break addr.to_string();
                    }
                }
                None => {
                    let _ = child.kill();
                    return Err("the service stopped before it listened".into());
                }
            }
        };
        // Its relay logs what it publishes: drained, so it never blocks on a full pipe.
        std::thread::spawn(move || for _ in lines {});
        Ok(Service { child, base })
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `c` clients `POST /orders` to `service` for `seconds`, each request with a new key
/// (`prefix-n`) and `sku` chosen by `sku(n)`; every answer must be `201 Created`.
async fn load(
    client: &reqwest::Client,
    service: &Service,
    c: usize,
    seconds: f64,
    prefix: &str,
    cold: bool,
) -> Result<Stats, BoxError> {
    let deadline = Duration::from_secs_f64(seconds);
    let (client0, machine0) = (process_cpu_micros(), machine_cpu_micros());
    let start = Instant::now();
    let next = Arc::new(AtomicI64::new(0));
    let url = format!("{}/orders", service.base);
    let workers: Vec<_> = (0..c)
        .map(|_| {
            let (client, url, next, prefix) = (
                client.clone(),
                url.clone(),
                next.clone(),
                prefix.to_string(),
            );
            tokio::spawn(async move {
                let mut micros = Vec::new();
                while start.elapsed() < deadline {
                    let n = next.fetch_add(1, Ordering::Relaxed);
                    let sku = if cold {
                        format!("sku-c-{}", n.wrapping_mul(7919) % COLD_SKUS as i64)
                    } else {
                        "sku-1".to_string()
                    };
                    let t = Instant::now();
                    let response = client
                        .post(&url)
                        .header("Idempotency-Key", format!("{prefix}-{n}"))
                        .json(&serde_json::json!({ "sku": sku, "qty": 1 }))
                        .send()
                        .await?;
                    let status = response.status();
                    let body = response.text().await?;
                    if status != reqwest::StatusCode::CREATED {
                        return Err::<_, BoxError>(
                            format!("POST /orders answered {status}: {body}").into(),
                        );
                    }
                    micros.push(t.elapsed().as_micros().min(u32::MAX as u128) as u32);
                }
                Ok(micros)
            })
        })
        .collect();
    let mut stats = Stats::default();
    for w in workers {
        stats.micros.extend(w.await??);
    }
    stats.secs = start.elapsed().as_secs_f64();
    stats.ops = stats.micros.len() as u64;
    stats.client_cpu = process_cpu_micros() - client0;
    stats.machine_cpu = machine_cpu_micros() - machine0;
    Ok(stats)
}

/// The HTTP layer against the bare handler at `c` clients: four services (layer and
/// bare, each on a fresh database of its own, for the hot row and for many), loaded in
/// turn, round after round. Prints a row per mode and returns the `http …` line.
pub(crate) async fn http_pass<B: BenchDb>(
    db: &Arc<B>,
    c: usize,
    args: &Args,
) -> Result<String, BoxError> {
    let binary = service_binary()?;
    let client = reqwest::Client::builder()
        .pool_max_idle_per_host(c)
        .build()?;
    let modes = [
        ("http-layer", true, false),
        ("http-bare", false, false),
        ("http-layer-c", true, true),
        ("http-bare-c", false, true),
    ];
    let mut services = Vec::new();
    for (i, (_, layer, _)) in modes.iter().enumerate() {
        let url = db
            .service_db(&format!("orderly_bench_http_{i}"), COLD_SKUS)
            .await?;
        services.push(Service::start(&binary, &url, *layer)?);
    }
    let mut stats = vec![Stats::default(); modes.len()];
    let slice = args.seconds / args.rounds as f64;
    for round in 0..args.rounds {
        for (i, (name, _, cold)) in modes.iter().enumerate() {
            let s = load(
                &client,
                &services[i],
                c,
                slice,
                &format!("{name}-{round}"),
                *cold,
            )
            .await?;
            stats[i].absorb(s);
        }
    }
    drop(services);
    let stats: Vec<Stats> = stats.into_iter().map(Stats::finish).collect();
    println!(
        "{c:>3}  (HTTP: the example service's POST /orders; `-c` runs spread over {COLD_SKUS} skus; the `vs floor` column is against the bare handler)"
    );
    for (i, (name, _, _)) in modes.iter().enumerate() {
        let s = &stats[i];
        let bare = &stats[i | 1];
        let (client, other) = s.cpu_per_op();
        println!(
            "{c:>3}  {name:<12} {:>9} {:>10.0} {:>9.3} {:>9.3} {:>9.2} {client:>10.0} {other:>10.0}",
            s.ops,
            s.throughput(),
            s.percentile(0.5),
            s.percentile(0.99),
            s.throughput() / bare.throughput()
        );
    }
    Ok(format!(
        "http backend={} c={c} hot_layer_vs_bare={:.2} cold_layer_vs_bare={:.2} layer_p99_ms={:.2} bare_p99_ms={:.2}",
        args.backend,
        stats[0].throughput() / stats[1].throughput(),
        stats[2].throughput() / stats[3].throughput(),
        stats[0].percentile(0.99),
        stats[1].percentile(0.99)
    ))
}
