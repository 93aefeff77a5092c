//! The suite's first run on a fresh machine: what the whole comparison needs and is missing —
//! iperf3 and Open MPI (Debian's `openmpi-bin`, `libopenmpi-dev`, through
//! `scripts/install-deps`, as root) and the Python peers (`scripts/python-env` builds
//! tensorwire into `.venv` with Ray, then pip installs pyzmq, gRPC, iceoryx2 and mpi4py) — is
//! set up before measuring, saying what it does. Whatever cannot be set up stays out of the
//! tables with the reason, as before; nothing here fails the run (a `--smoke` run under
//! `TENSORWIRE_REQUIRE_PEERS=1` fails afterwards, naming what is missing).

use std::path::Path;
use std::process::{Command, Stdio};

use crate::cli::Part;
use crate::report::say;
use crate::suite::Plan;
use crate::suite::peers::{python_with_tensorwire, workspace_root};

/// The peers' Python packages (pip names) and the module each one imports.
const PEERS: [(&str, &str); 4] = [
    ("pyzmq", "zmq"),
    ("grpcio", "grpc"),
    ("iceoryx2", "iceoryx2"),
    ("mpi4py", "mpi4py"),
];

/// Sets up what the run's references and peers need and this machine lacks.
pub(crate) fn prepare(plan: &Plan) {
    let Some(root) = workspace_root() else {
        return;
    };
    let peers = plan.parts.contains(&Part::Peers) && !crate::placement::is_across();
    if !plan.smoke && !on_path("iperf3") {
        say!("iperf3 is missing (the TCP reference): installing it with scripts/install-deps");
        run_script(&root, "scripts/install-deps", "iperf3 stays unmeasured");
    }
    if peers && !(on_path("mpirun") && on_path("mpicc") && on_path("cc")) {
        say!(
            "Open MPI or a C compiler is missing (the MPI peers; their C ranks are built with \
             mpicc): installing them with scripts/install-deps"
        );
        run_script(
            &root,
            "scripts/install-deps",
            "the MPI peers stay unmeasured",
        );
    }
    if !peers {
        return;
    }
    if python_with_tensorwire(&root).is_none() {
        say!(
            "the Python peers need tensorwire in .venv: building it with scripts/python-env \
             (first run only, a few minutes)"
        );
        run_script(&root, "scripts/python-env", "the peers stay unmeasured");
    }
    let python = root.join(".venv/bin/python");
    if !python.is_file() {
        return;
    }
    let missing: Vec<&str> = PEERS
        .iter()
        .filter(|(_, module)| !imports(&python, module))
        .map(|(package, _)| *package)
        .collect();
    if missing.is_empty() {
        return;
    }
    say!(
        "installing the peers into .venv (first run only): pip install {}",
        missing.join(" ")
    );
    let installed = Command::new(&python)
        .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
        .args(&missing)
        .stdout(Stdio::null())
        .status();
    if !installed.is_ok_and(|status| status.success()) {
        say!("  pip could not install them: those peers stay unmeasured");
    }
}

fn on_path(program: &str) -> bool {
    Command::new(program)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok()
}

fn imports(python: &Path, module: &str) -> bool {
    Command::new(python)
        .args(["-c", &format!("import {module}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

/// Runs `root/script` with its output on stderr; says `otherwise` if it fails.
fn run_script(root: &Path, script: &str, otherwise: &str) {
    let ran = Command::new(root.join(script))
        .current_dir(root)
        .stdout(Stdio::from(std::io::stderr()))
        .status();
    if !ran.is_ok_and(|status| status.success()) {
        say!("  {script} did not finish: {otherwise}");
    }
}
