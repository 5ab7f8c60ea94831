//! A Kafka broker on loopback for the Kafka sink's tests and the `kafka` bench.

use std::path::Path;
use std::time::{Duration, Instant};

use super::free_port;

/// One Kafka broker in KRaft mode (broker and controller in one process) on 127.0.0.1:
/// Apache Kafka's own jars (`scripts/kafka.sh`, from Maven Central, cached once per
/// machine) on the machine's Java. Its log directory is its own; [`KafkaBroker::stop`] and
/// [`KafkaBroker::restart`] take it down and bring it back on the same ports and data.
/// Killed when dropped.
pub struct KafkaBroker {
    child: Option<std::process::Child>,
    lib: String,
    /// Where clients connect.
    pub port: u16,
    /// The port it tells clients to use for it: [`KafkaBroker::port`], or a proxy's in
    /// front of it ([`KafkaBroker::start_advertising`]).
    pub advertised: u16,
    controller: u16,
    /// A second listener, SASL_SSL with PLAIN ([`KafkaBroker::start_secured`]).
    pub secured: Option<u16>,
    dir: tempfile::TempDir,
}

impl KafkaBroker {
    /// Starts it and waits until it takes connections and has a leader for its metadata.
    pub fn start() -> KafkaBroker {
        let port = free_port();
        KafkaBroker::start_advertising(port, port)
    }

    /// Starts it on `port`, telling clients to reach it at `advertised` (a proxy's port
    /// that forwards to `port`).
    pub fn start_advertising(port: u16, advertised: u16) -> KafkaBroker {
        KafkaBroker::start_with(port, advertised, None)
    }

    /// Starts it with a second listener, on [`KafkaBroker::secured`]: SASL_SSL, its key and
    /// certificate chain in `keystore_pem` (one PEM file, the key PKCS#8, unencrypted),
    /// PLAIN sign-in for `users` (name, password).
    pub fn start_secured(keystore_pem: &Path, users: &[(&str, &str)]) -> KafkaBroker {
        let port = free_port();
        let users: String = users
            .iter()
            .map(|(u, p)| format!(" user_{u}=\"{p}\""))
            .collect();
        let listener = format!(
            "sasl.enabled.mechanisms=PLAIN\n\
             listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required{users};\n\
             ssl.keystore.type=PEM\n\
             ssl.keystore.location={}\n",
            keystore_pem.display()
        );
        KafkaBroker::start_with(port, port, Some(listener))
    }

    /// Starts it: `secured`, the second listener's own properties.
    fn start_with(port: u16, advertised: u16, secured: Option<String>) -> KafkaBroker {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let got = std::process::Command::new("bash")
            .arg(repo.join("scripts/kafka.sh"))
            .output()
            .expect("run scripts/kafka.sh");
        assert!(
            got.status.success(),
            "{}",
            String::from_utf8_lossy(&got.stderr)
        );
        let broker = KafkaBroker {
            child: None,
            lib: String::from_utf8_lossy(&got.stdout).trim().to_owned(),
            port,
            advertised,
            controller: free_port(),
            secured: secured.as_ref().map(|_| free_port()),
            dir: tempfile::tempdir().expect("a directory for the Kafka broker"),
        };
        // The secured listener is advertised as it listens.
        let secured_at = broker
            .secured
            .map_or(String::new(), |s| format!(",SASL_SSL://127.0.0.1:{s}"));
        let mut properties = format!(
            "process.roles=broker,controller\n\
             node.id=1\n\
             controller.quorum.voters=1@127.0.0.1:{c}\n\
             listeners=PLAINTEXT://127.0.0.1:{p},CONTROLLER://127.0.0.1:{c}{secured_at}\n\
             advertised.listeners=PLAINTEXT://127.0.0.1:{a}{secured_at}\n\
             controller.listener.names=CONTROLLER\n\
             listener.security.protocol.map=PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_SSL:SASL_SSL\n\
             inter.broker.listener.name=PLAINTEXT\n\
             log.dirs={d}\n\
             num.partitions=3\n\
             offsets.topic.replication.factor=1\n\
             transaction.state.log.replication.factor=1\n\
             transaction.state.log.min.isr=1\n\
             group.initial.rebalance.delay.ms=0\n",
            c = broker.controller,
            p = broker.port,
            a = broker.advertised,
            d = broker.dir.path().join("data").display(),
        );
        properties.push_str(secured.as_deref().unwrap_or_default());
        std::fs::write(broker.properties(), properties).expect("server.properties");
        // A cluster id is 16 bytes in URL-safe base64 (22 characters).
        let cluster_id = "YW5rdXNhLXRlc3Qta2Fmaw";
        let formatted = broker
            .java()
            .args(["kafka.tools.StorageTool", "format", "-t", cluster_id, "-c"])
            .arg(broker.properties())
            .output()
            .expect("run Kafka's StorageTool");
        assert!(
            formatted.status.success(),
            "format the broker's log directory: {}{}",
            String::from_utf8_lossy(&formatted.stdout),
            String::from_utf8_lossy(&formatted.stderr)
        );
        let mut broker = broker;
        broker.restart();
        broker
    }

    fn properties(&self) -> std::path::PathBuf {
        self.dir.path().join("server.properties")
    }

    /// `java` with the broker's class path, a small heap and its log configuration.
    fn java(&self) -> std::process::Command {
        let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
        let mut cmd = std::process::Command::new("java");
        cmd.args([
            "-Xms64m",
            "-Xmx512m",
            "-XX:+UseSerialGC",
            "-XX:TieredStopAtLevel=1",
        ])
        .arg(format!(
            "-Dlog4j2.configurationFile={}",
            repo.join("e2e/testenv/kafka/log4j2.properties").display()
        ))
        .arg("-cp")
        .arg(format!("{}/*", self.lib));
        cmd
    }

    /// The broker's process id while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(std::process::Child::id)
    }

    /// `127.0.0.1:PORT`, the advertised port: what clients bootstrap from.
    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.advertised)
    }

    /// Starts it again (after [`KafkaBroker::stop`]) on its ports and data, and waits until
    /// it takes connections.
    pub fn restart(&mut self) {
        assert!(self.child.is_none(), "the Kafka broker runs already");
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(self.dir.path().join("kafka.log"))
            .expect("kafka.log");
        let mut cmd = self.java();
        cmd.arg("kafka.Kafka").arg(self.properties());
        self.child = Some(
            cmd.stdout(log.try_clone().expect("kafka.log"))
                .stderr(log)
                .spawn()
                .expect("start the Kafka broker (java)"),
        );
        let deadline = Instant::now() + Duration::from_secs(90);
        while std::net::TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            assert!(
                Instant::now() < deadline,
                "the Kafka broker never listened: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// What the broker logged (warnings and errors).
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("kafka.log")).unwrap_or_default()
    }

    /// Kills it (SIGKILL: a broker that is gone, not one that says goodbye).
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for KafkaBroker {
    fn drop(&mut self) {
        self.stop();
    }
}
