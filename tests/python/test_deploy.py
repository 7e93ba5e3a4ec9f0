"""deploy/ stays true to the binaries: every manifest parses, every flag, config key and CKPTD_*
variable it uses is one the binary accepts (asked from the binaries' own --help), config files
load with `ckptd --print-config`, and the numbers that must agree do (grace periods longer than
the drain timeout, memory limits covering the pool, the trainer's group and socket directory
matching the daemon's).

Without the binaries: the systemd units' hardening (a dedicated user, no capabilities, a
read-only system with the storage root writable), the DaemonSet's rolling update, and the
Prometheus alerting rules (`promtool check rules` and their `promtool test rules` unit tests;
skipped where promtool is not installed: Debian package prometheus, deploy/install-deps.sh).

ckpt-coordinator is built only when the coordinator is part of the tree; without it, its flags
(and the daemon's coordinator-* link keys) cannot be checked and the checks say so by skipping.
"""

import glob
import os
import re
import shutil
import subprocess
import tempfile
import unittest

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
DEPLOY = os.path.join(HERE, "..", "..", "deploy")
BIN_DIR = os.environ.get("CKPT_BIN_DIR", "")


def binary(name):
    path = os.path.join(BIN_DIR, name)
    return path if os.access(path, os.X_OK) else None


_help_cache = {}


def help_text(name, *sub):
    key = (name,) + sub
    if key not in _help_cache:
        p = subprocess.run([binary(name)] + list(sub) + ["--help"], capture_output=True,
                           text=True, timeout=30)
        _help_cache[key] = p.stdout + p.stderr
    return _help_cache[key]


def flags_of(text):
    return set(re.findall(r"--[a-z0-9][a-z0-9-]*", text))


def seconds(text):
    m = re.fullmatch(r"(\d+)(ms|s|m|h)?", str(text).strip())
    assert m, "not a duration: %r" % text
    scale = {"ms": 0.001, "s": 1, None: 1, "m": 60, "h": 3600}[m.group(2)]
    return int(m.group(1)) * scale


def gib(text):
    m = re.fullmatch(r"(\d+)(Gi|GiB)", str(text).strip())
    assert m, "not a GiB size: %r" % text
    return int(m.group(1))


def k8s_docs():
    docs = []
    for path in sorted(glob.glob(os.path.join(DEPLOY, "k8s", "*.yaml"))):
        with open(path) as f:
            for doc in yaml.safe_load_all(f):
                if doc is not None:
                    docs.append((os.path.basename(path), doc))
    return docs


def find(kind, name=None):
    for _, doc in k8s_docs():
        if doc["kind"] == kind and (name is None or doc["metadata"]["name"] == name):
            return doc
    raise AssertionError("no %s %s in deploy/k8s" % (kind, name or ""))


def containers(doc):
    spec = doc.get("spec", {})
    pod = spec.get("template", {}).get("spec", spec)
    return pod.get("containers", [])


def command_lines(container):
    """Every argv the container runs: its command + args, and its exec probes."""
    lines = [list(container.get("command", [])) + list(container.get("args", []))]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        exec_ = container.get(probe, {}).get("exec")
        if exec_:
            lines.append(list(exec_["command"]))
    return lines


def unit_file(name):
    """A systemd unit as {section: {key: value}} (last value wins, as systemd reads most keys)."""
    out, section = {}, None
    with open(os.path.join(DEPLOY, "systemd", name)) as f:
        for line in f:
            line = line.strip()
            if not line or line[0] in "#;":
                continue
            if line.startswith("["):
                section = out.setdefault(line.strip("[]"), {})
                continue
            key, _, value = line.partition("=")
            section[key.strip()] = value.strip()
    return out


def configmap_ckptd_yaml():
    return yaml.safe_load(find("ConfigMap", "ckptd-config")["data"]["ckptd.yaml"])


def example_config():
    with open(os.path.join(DEPLOY, "ckptd.yaml")) as f:
        return yaml.safe_load(f)


def covers(paths, path):
    """Whether one of the space-separated unit paths (a leading '-' or '+' allowed) is `path` or
    a directory above it."""
    path = os.path.normpath(path)
    for p in paths.split():
        p = os.path.normpath(p.lstrip("-+"))
        if path == p or path.startswith(p.rstrip("/") + "/"):
            return True
    return False


class DeployTest(unittest.TestCase):
    def setUp(self):
        for name in ("ckptd", "ckptctl"):
            if binary(name) is None:
                self.fail("CKPT_BIN_DIR=%r has no %s; build it first" % (BIN_DIR, name))

    def check_argv(self, argv, where):
        name = os.path.basename(argv[0])
        if name == "python3":
            return
        if binary(name) is None:
            self.assertEqual(name, "ckpt-coordinator", "%s: unknown binary %s" % (where, name))
            raise unittest.SkipTest("%s: ckpt-coordinator is not built here; its flags %s are "
                                    "unchecked" % (where, sorted(flags_of(" ".join(argv)))))
        known = flags_of(help_text(name))
        # Subcommands (ckptctl health, status, ...) have flags of their own.
        for token in argv[1:]:
            if re.fullmatch(r"[a-z]+", token) and token in help_text(name):
                known |= flags_of(help_text(name, token))
        used = {t.split("=")[0] for t in argv[1:] if t.startswith("--")}
        self.assertEqual(used - known, set(), "%s: %s does not accept these flags" % (where, name))

    def check_ckptd_config(self, values, where):
        keys = set(values)
        known = {f[2:] for f in flags_of(help_text("ckptd"))}
        unknown = keys - known
        link_keys = {k for k in unknown if k.startswith("coordinator-")}
        if link_keys and binary("ckpt-coordinator") is None:
            unknown -= link_keys  # the coordinator link's keys come with the coordinator
            values = {k: v for k, v in values.items() if k not in link_keys}
        self.assertEqual(unknown, set(), "%s: keys ckptd does not know" % where)
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            yaml.safe_dump(values, f)
            f.flush()
            p = subprocess.run([binary("ckptd"), "--config", f.name, "--print-config"],
                               capture_output=True, text=True, timeout=30)
        self.assertEqual(p.returncode, 0, "%s: %s" % (where, p.stderr))
        return yaml.safe_load(p.stdout)

    # -- Kubernetes ---------------------------------------------------------------------------

    def test_every_manifest_parses_and_names_itself(self):
        docs = k8s_docs()
        self.assertGreaterEqual(len(docs), 6)
        kinds = {doc["kind"] for _, doc in docs}
        self.assertTrue({"DaemonSet", "Deployment", "Service", "ConfigMap", "Pod"} <= kinds, kinds)
        for path, doc in docs:
            self.assertIn("apiVersion", doc, path)
            if doc["kind"] != "Kustomization":
                self.assertTrue(doc["metadata"]["name"], path)

    def test_daemonset_runs_flags_ckptd_and_ckptctl_accept(self):
        ds = find("DaemonSet", "ckptd")
        for c in containers(ds):
            for argv in command_lines(c):
                self.check_argv(argv, "daemonset.yaml")
            env_known = set(re.findall(r"CKPTD_[A-Z0-9_]+", help_text("ckptd")))
            for e in c.get("env", []):
                if e["name"].startswith("CKPTD_"):
                    self.assertIn(e["name"], env_known, "daemonset.yaml env")

    def test_coordinator_deployment_runs_flags_the_binaries_accept(self):
        dep = find("Deployment", "ckpt-coordinator")
        self.assertEqual(dep["spec"]["replicas"], 1)
        self.assertEqual(dep["spec"]["strategy"]["type"], "Recreate")
        svc = find("Service", "ckpt-coordinator")
        self.assertEqual(svc["spec"]["ports"][0]["port"], 7470)
        for c in containers(dep):
            for argv in command_lines(c)[1:]:  # probes (ckptctl) first: always checkable
                self.check_argv(argv, "coordinator.yaml probe")
            self.check_argv(command_lines(c)[0], "coordinator.yaml")

    def test_configmap_is_a_config_ckptd_loads(self):
        values = configmap_ckptd_yaml()
        effective = self.check_ckptd_config(values, "configmap.yaml")
        self.assertEqual(effective["admin"], values["admin"])
        # The daemon must know where the coordinator is: the address names the Service.
        self.assertTrue(values["coordinator"].startswith("ckpt-coordinator."), values)

    def test_daemonset_numbers_agree_with_its_config(self):
        config = configmap_ckptd_yaml()
        ds = find("DaemonSet", "ckptd")
        pod = ds["spec"]["template"]["spec"]
        self.assertGreater(pod["terminationGracePeriodSeconds"], seconds(config["shutdown-timeout"]))
        (c,) = pod["containers"]
        res = c["resources"]
        self.assertEqual(res["requests"], res["limits"], "Guaranteed QoS: requests = limits")
        self.assertGreater(gib(res["limits"]["memory"]), gib(config["host-pool"]))
        self.assertIn("IPC_LOCK", c["securityContext"]["capabilities"]["add"])
        admin = config["admin"]
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            self.assertIn(admin, c[probe]["exec"]["command"], probe)
        run = [v for v in pod["volumes"] if v["name"] == "run"][0]["hostPath"]["path"]
        self.assertEqual(os.path.dirname(config["socket"]), run)

        trainer = find("Pod", "trainer-example")["spec"]
        self.assertIn(int(config["socket-group"]), trainer["securityContext"]["supplementalGroups"])
        paths = [v["hostPath"]["path"] for v in trainer["volumes"] if "hostPath" in v]
        self.assertIn(run, paths)
        mounts = [m["mountPath"] for m in trainer["containers"][0]["volumeMounts"]]
        self.assertIn(os.path.dirname(config["socket"]), mounts)
        self.assertTrue(trainer["hostIPC"] and pod["hostIPC"])

    # -- systemd and the example config -------------------------------------------------------

    def test_example_config_loads(self):
        with open(os.path.join(DEPLOY, "ckptd.yaml")) as f:
            values = yaml.safe_load(f)
        effective = self.check_ckptd_config(values, "deploy/ckptd.yaml")
        self.assertTrue(effective["admin"].startswith("127.0.0.1:"), "admin on loopback")
        self.assertTrue(effective["metrics"].startswith("127.0.0.1:"), "metrics on loopback")

    def test_ckptd_unit(self):
        unit = unit_file("ckptd.service")["Service"]
        self.assertEqual(unit["Type"], "notify")
        self.assertEqual(unit["LimitMEMLOCK"], "infinity")
        self.assertIn("WatchdogSec", unit)
        self.assertIn("on-failure", unit["Restart"])
        self.check_argv(unit["ExecStart"].split(), "ckptd.service")
        with open(os.path.join(DEPLOY, "ckptd.yaml")) as f:
            drain = seconds(yaml.safe_load(f)["shutdown-timeout"])
        self.assertGreater(seconds(unit["TimeoutStopSec"]), drain)

    def test_coordinator_unit(self):
        unit = unit_file("ckpt-coordinator.service")["Service"]
        self.assertEqual(unit["Type"], "notify")
        self.assertIn("on-failure", unit["Restart"])
        self.check_argv(unit["ExecStart"].split(), "ckpt-coordinator.service")


class StaticDeployTest(unittest.TestCase):
    """What needs no binary: the units' sandbox, the DaemonSet's update strategy, and that the
    alert tests cover every alert."""

    def check_hardening(self, name, storage_root):
        unit = unit_file(name)
        service = unit["Service"]
        self.assertEqual(service.get("User"), "ckptd", "%s: a dedicated user, not root" % name)
        self.assertEqual(service.get("Group"), "ckptd", name)
        self.assertEqual(service.get("NoNewPrivileges"), "yes", name)
        self.assertEqual(service.get("CapabilityBoundingSet"), "", "%s: no capabilities" % name)
        self.assertEqual(service.get("ProtectSystem"), "strict", name)
        self.assertTrue(covers(service.get("ReadWritePaths", ""), storage_root),
                        "%s: ReadWritePaths=%r leaves the storage root %s read-only"
                        % (name, service.get("ReadWritePaths"), storage_root))
        self.assertTrue(covers(unit["Unit"].get("RequiresMountsFor", ""), storage_root),
                        "%s: RequiresMountsFor does not name the storage root %s"
                        % (name, storage_root))
        for key in ("ProtectHome", "PrivateTmp", "ProtectKernelTunables", "ProtectKernelModules",
                    "ProtectControlGroups", "RestrictNamespaces", "LockPersonality",
                    "RestrictRealtime", "RestrictSUIDSGID"):
            self.assertEqual(service.get(key), "yes", "%s: %s" % (name, key))
        self.assertEqual(service.get("SystemCallArchitectures"), "native", name)
        self.assertEqual(set(service.get("RestrictAddressFamilies", "").split()),
                         {"AF_UNIX", "AF_INET", "AF_INET6", "AF_NETLINK"}, name)
        return service

    def test_ckptd_unit_is_hardened(self):
        config = example_config()
        service = self.check_hardening("ckptd.service", config["storage-root"])
        # The pool is pinned through the rlimit, not a capability; the GPU needs /dev/nvidia*.
        self.assertEqual(service["LimitMEMLOCK"], "infinity")
        self.assertNotIn("AmbientCapabilities", {k for k, v in service.items() if v})
        self.assertNotEqual(service.get("PrivateDevices"), "yes", "CUDA needs /dev/nvidia*")
        self.assertNotIn("DeviceAllow", service, "CUDA needs /dev/nvidia*")
        self.assertNotEqual(service.get("ProtectClock"), "yes",
                            "implies a DeviceAllow= list on older systemd")
        self.assertNotEqual(service.get("MemoryDenyWriteExecute"), "yes", "the CUDA driver JITs")
        # The socket's group is the daemon's own (chown to it needs no capability), and the
        # socket's directory is the unit's RuntimeDirectory.
        self.assertEqual(str(config["socket-group"]), service["Group"])
        argv = service["ExecStart"].split()
        socket = argv[argv.index("--socket") + 1]
        self.assertEqual(os.path.dirname(socket), "/run/" + service["RuntimeDirectory"])

    def test_coordinator_unit_is_hardened(self):
        service = unit_file("ckpt-coordinator.service")["Service"]
        argv = service["ExecStart"].split()
        root = argv[argv.index("--storage-root") + 1]
        service = self.check_hardening("ckpt-coordinator.service", root)
        self.assertEqual(service.get("PrivateDevices"), "yes")
        self.assertEqual(service.get("MemoryDenyWriteExecute"), "yes")

    def test_sysusers_creates_the_units_user(self):
        with open(os.path.join(DEPLOY, "systemd", "ckptd.sysusers")) as f:
            lines = [l.split() for l in f if l.strip() and not l.startswith("#")]
        self.assertIn(["u", "ckptd"], [l[:2] for l in lines])

    def test_daemonset_rolls_one_node_at_a_time(self):
        ds = find("DaemonSet", "ckptd")
        strategy = ds["spec"]["updateStrategy"]
        self.assertEqual(strategy["type"], "RollingUpdate")
        rolling = strategy["rollingUpdate"]
        # A surge pod would be a second daemon on the node's socket.
        self.assertEqual(rolling["maxSurge"], 0)
        unavailable = rolling["maxUnavailable"]
        self.assertTrue(isinstance(unavailable, int) and unavailable >= 1
                        or re.fullmatch(r"[1-9][0-9]?%", str(unavailable)), unavailable)
        pod = ds["spec"]["template"]["spec"]
        drain = seconds(configmap_ckptd_yaml()["shutdown-timeout"])
        self.assertGreater(pod["terminationGracePeriodSeconds"], drain)

    def test_promtool_tests_cover_every_alert(self):
        """Each alert fires in some test case and is checked silent in another."""
        with open(PromtoolTest.RULES) as f:
            alerts = {r["alert"] for g in yaml.safe_load(f)["groups"] for r in g["rules"]
                      if "alert" in r}
        with open(PromtoolTest.TESTS) as f:
            tests = yaml.safe_load(f)["tests"]
        fired, silent = set(), set()
        for t in tests:
            for case in t.get("alert_rule_test", []):
                (fired if case.get("exp_alerts") else silent).add(case["alertname"])
        self.assertEqual(alerts - fired, set(), "alerts no test makes fire")
        self.assertEqual(alerts - silent, set(), "alerts no test checks silent")


class PromtoolTest(unittest.TestCase):
    """deploy/prometheus: the alerting rules load, and each alert fires in its unit test and
    stays silent on healthy series."""

    RULES = os.path.join(DEPLOY, "prometheus", "ckptd-alerts.yaml")
    TESTS = os.path.join(DEPLOY, "prometheus", "ckptd-alerts.test.yaml")

    def setUp(self):
        self.promtool = shutil.which("promtool")
        if self.promtool is None:
            raise unittest.SkipTest("promtool is not installed (Debian package prometheus, in "
                                    "deploy/install-deps.sh): the alerting rules are unchecked")

    def promtool_run(self, *args):
        p = subprocess.run([self.promtool] + list(args), capture_output=True, text=True,
                           timeout=120)
        self.assertEqual(p.returncode, 0, "promtool %s failed:\n%s%s"
                         % (" ".join(args), p.stdout, p.stderr))
        return p.stdout + p.stderr

    def test_promtool_check_rules(self):
        out = self.promtool_run("check", "rules", self.RULES)
        self.assertIn("SUCCESS", out)

    def test_promtool_test_rules(self):
        out = self.promtool_run("test", "rules", self.TESTS)
        self.assertIn("SUCCESS", out)


if __name__ == "__main__":
    unittest.main()
