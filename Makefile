# oncepay — every command a newcomer needs. `make help` lists them.
SHELL := /bin/bash
.DEFAULT_GOAL := help

# The PostgreSQL server used by `make run` and the tests. If none answers
# here, `make db` starts a private cluster under .pgdata/ on this port.
PGHOST ?= 127.0.0.1
PGPORT ?= 5432
PG_SERVER ?= postgres://postgres@$(PGHOST):$(PGPORT)
DATABASE_URL ?= $(PG_SERVER)/oncepay
export DATABASE_URL
# The tests create one database per test on this server, named
# oncepay_test_<run id>_<created>_<random> (crates/oncepay-testkit/src/test_db.rs).
export TEST_DATABASE_SERVER ?= $(PG_SERVER)
# Each make is a test run with an id of its own (the time and make's pid,
# in hex), which its databases carry: test-dbs-drop drops this run's, never
# another's. Give ONCEPAY_TEST_RUN_ID (1-16 of a-z0-9) to choose it.
ifndef ONCEPAY_TEST_RUN_ID
ONCEPAY_TEST_RUN_ID := $(shell printf '%x%x' "$$(date +%s)" "$$PPID")
endif
export ONCEPAY_TEST_RUN_ID
# Other runs' test databases are dropped only once they are this old and
# nobody is connected to them: a run that crashed left them.
TEST_DB_STALE_HOURS ?= 6

BIN := target/debug/oncepay
# One release build for make bench, make chaos and make chaos-ha: built
# apart, the bench's hdrhistogram turns on features of byteorder and
# num-traits that the chaos harness does not, and each target rebuilt sqlx
# and oncepay after the other (about 2 minutes each way).
RELEASE_BUILD := cargo build --release -p oncepay -p oncepay-bench -p oncepay-chaos
RUN_DIR := .run

.PHONY: help run db build test test-dbs-drop lint fmt clean bench chaos chaos-ha chaos-restore ha-packages localstripe pyjwt axe openapi-ts fuzz fuzz-campaign

# The variables the targets' descriptions name, printed with their values.
HELP_VARS := PGHOST PGPORT TEST_DB_STALE_HOURS
help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-14s %s\n", $$1, $$2}' \
	  | sed $(foreach v,$(HELP_VARS),-e 's|\$$($(v))|$($(v))|g')

db: ## make sure PostgreSQL answers on $(PGHOST):$(PGPORT) (starts a private cluster under .pgdata/ if not)
	@if pg_isready -q -h $(PGHOST) -p $(PGPORT) 2>/dev/null; then \
	  echo "PostgreSQL is up on $(PGHOST):$(PGPORT)"; \
	elif command -v initdb >/dev/null && command -v pg_ctl >/dev/null; then \
	  as=""; if [ "$$(id -u)" = 0 ]; then as="runuser -u postgres --"; fi; \
	  if [ ! -d .pgdata ]; then \
	    mkdir -p .pgdata && { [ -z "$$as" ] || chown postgres .pgdata; }; \
	    $$as initdb -D .pgdata -U postgres -A trust >/dev/null; \
	  fi; \
	  $$as pg_ctl -D .pgdata -l .pgdata/server.log -w \
	    -o "-p $(PGPORT) -c listen_addresses=$(PGHOST) -k /tmp" start; \
	else \
	  echo "No PostgreSQL on $(PGHOST):$(PGPORT), and initdb/pg_ctl are not on the PATH."; \
	  echo "Start one (or use 'docker compose up'), or set PGHOST/PGPORT."; exit 1; \
	fi

build: ## compile the oncepay binary (debug)
	cargo build --bin oncepay

# make run's ports (RUN_PORT=9080 RUN_SANDBOX_PORT=9081 where 8080/8081 are taken).
RUN_PORT ?= 8080
RUN_SANDBOX_PORT ?= 8081
RUN_URL = http://127.0.0.1:$(RUN_PORT)
RUN_SANDBOX_URL = http://127.0.0.1:$(RUN_SANDBOX_PORT)
run: db build ## start the sandbox and oncepay with a dev API key; print a curl that pays an order and a checkout page to pay one in a browser
	@mkdir -p $(RUN_DIR)
	@for port in $(RUN_PORT) $(RUN_SANDBOX_PORT); do \
	  curl -s -o /dev/null --max-time 1 http://127.0.0.1:$$port/; \
	  if [ $$? -ne 7 ]; then \
	    echo "make run: port $$port on 127.0.0.1 is taken (oncepay on RUN_PORT=$(RUN_PORT), the sandbox on RUN_SANDBOX_PORT=$(RUN_SANDBOX_PORT)); stop what listens there or pick others, e.g. make run RUN_PORT=9080 RUN_SANDBOX_PORT=9081."; \
	    exit 1; \
	  fi; \
	done
	@$(BIN) migrate >/dev/null
	@ONCEPAY_SANDBOX_BIND=127.0.0.1:$(RUN_SANDBOX_PORT) ONCEPAY_SANDBOX_WEBHOOK_URL=$(RUN_URL)/webhooks/sandbox \
	  $(BIN) sandbox > $(RUN_DIR)/sandbox.log 2>&1 & sandbox=$$!; \
	ONCEPAY_BIND=127.0.0.1:$(RUN_PORT) ONCEPAY_PROVIDER_URL=$(RUN_SANDBOX_URL) ONCEPAY_WEBHOOK_ALLOW_PRIVATE=true \
	  $(BIN) serve > $(RUN_DIR)/serve.log 2>&1 & serve=$$!; \
	trap 'kill $$sandbox $$serve 2>/dev/null' EXIT INT TERM; \
	key=$$($(BIN) api-key create --merchant dev | tail -n 1); \
	for i in $$(seq 1 100); do curl -sf $(RUN_URL)/readyz >/dev/null && break; sleep 0.1; done; \
	if ! curl -sf $(RUN_URL)/readyz >/dev/null; then \
	  echo "make run: oncepay did not become ready; the end of $(RUN_DIR)/serve.log:"; \
	  tail -n 20 $(RUN_DIR)/serve.log; exit 1; \
	fi; \
	order=$$(curl -s -X POST $(RUN_URL)/orders -H "Authorization: Bearer $$key" \
	  -H "Idempotency-Key: run-order-$$(date +%s%N)" -H 'Content-Type: application/json' \
	  -d '{"customer_id":"cus_1","currency":"EUR","items":[{"sku":"book","quantity":2,"unit_amount":1250}]}' \
	  | sed -E 's/.*"id":"([^"]+)".*/\1/'); \
	checkout=$$(curl -s -X POST $(RUN_URL)/orders/$$order/checkout -H "Authorization: Bearer $$key" \
	  -H "Idempotency-Key: run-checkout-$$order" | sed -E 's/.*"url":"([^"]+)".*/\1/'); \
	echo; \
	echo "oncepay on $(RUN_URL) (log: $(RUN_DIR)/serve.log), sandbox provider on $(RUN_SANDBOX_URL) (log: $(RUN_DIR)/sandbox.log)"; \
	echo "Development API key: $$key"; \
	echo; \
	echo "Pay order $$order in a browser (hosted checkout, valid for an hour):"; \
	echo "  $$checkout"; \
	echo; \
	echo "Or create an order and pay it with curl (in another terminal):"; \
	echo; \
	echo "  KEY=$$key"; \
	echo "  ORDER=\$$(curl -s -X POST $(RUN_URL)/orders -H \"Authorization: Bearer \$$KEY\" \\"; \
	echo "    -H \"Idempotency-Key: order-\$$(date +%s%N)\" -H 'Content-Type: application/json' \\"; \
	echo "    -d '{\"customer_id\":\"cus_1\",\"currency\":\"EUR\",\"items\":[{\"sku\":\"book\",\"quantity\":2,\"unit_amount\":1250}]}' \\"; \
	echo "    | sed -E 's/.*\"id\":\"([^\"]+)\".*/\\1/'); echo \"order \$$ORDER\""; \
	echo "  curl -si -w '\n' -X POST $(RUN_URL)/payments -H \"Authorization: Bearer \$$KEY\" \\"; \
	echo "    -H \"Idempotency-Key: pay-\$$ORDER\" -H 'Content-Type: application/json' \\"; \
	echo "    -d \"{\\\"order_id\\\":\\\"\$$ORDER\\\",\\\"payment_method\\\":\\\"tok_visa\\\"}\""; \
	echo; \
	echo "Send the payment again: the answer is the first one, replayed (its headers include idempotent-replayed: true),"; \
	echo "and the card is charged once; check the provider's books at $(RUN_SANDBOX_URL)/v1/ledger."; \
	echo "Ctrl-C stops both."; \
	echo; \
	wait $$serve

test: localstripe pyjwt axe openapi-ts ## run every test (unit, properties, API, multi-process, schemathesis, a generated TypeScript client, the fuzz corpus and a few seconds of fuzzing, a short chaos soak)
	@command -v schemathesis >/dev/null || python3 -m pip install --quiet schemathesis
	@echo "test run $$ONCEPAY_TEST_RUN_ID: its databases are oncepay_test_$${ONCEPAY_TEST_RUN_ID}_*"
	@$(MAKE) --no-print-directory test-dbs-drop
	@status=0; \
	trap '$(MAKE) --no-print-directory test-dbs-drop; exit 130' INT TERM; \
	fuzz/run.sh replay || status=$$?; \
	if cargo nextest --version >/dev/null 2>&1; then \
	  cargo test --workspace --doc --quiet || status=$$?; \
	  cargo nextest run --workspace --no-fail-fast || status=$$?; \
	else \
	  cargo test --workspace || status=$$?; \
	fi; \
	$(MAKE) --no-print-directory test-dbs-drop; \
	if [ $$status -eq 0 ]; then \
	  for provider in sandbox stripe balance; do \
	    n=$$(cargo test -q -p oncepay --test api -- --list 2>/dev/null | grep -c "^provider_contract::$$provider::"); \
	    echo "provider contract: $$n scenarios passed against $$provider"; \
	    if [ $$provider = balance ]; then \
	      cargo test -q -p oncepay --test api provider_contract::balance_skips -- --nocapture 2>/dev/null | sed -n 's/^skipped against balance: /  skipped: /p'; \
	    else \
	      echo "  disputes: $$(cargo test -q -p oncepay --test api -- --list 2>/dev/null | sed -n "s/^provider_contract::$$provider::\(dispute_[a-z_]*\): test$$/\1/p" | tr '\n' ' ')"; \
	    fi; \
	  done; \
	fi; \
	exit $$status

# axe-core (npm), the accessibility checker the checkout's browser tests
# run in Chromium: a test tool only, never shipped.
AXE_DIR := target/axe
AXE_VERSION := 4.11.0
axe: ## install axe-core (npm) into target/axe if missing (the checkout's accessibility tests)
	@if [ ! -f $(AXE_DIR)/node_modules/axe-core/axe.min.js ] && command -v npm >/dev/null; then \
	  echo "installing axe-core $(AXE_VERSION) into $(AXE_DIR) ..."; \
	  npm install --silent --no-audit --no-fund --prefix $(AXE_DIR) axe-core@$(AXE_VERSION); \
	fi

# openapi-typescript, openapi-fetch and TypeScript (npm): the API tests
# generate a TypeScript client's types from openapi.yaml and type-check a
# program calling every operation (crates/oncepay/tests/typescript/). Test
# tools only, never shipped; reinstalled when the pins below change.
OPENAPI_TS_DIR := target/openapi-ts
OPENAPI_TS_PACKAGES := openapi-typescript@7.13.0 openapi-fetch@0.17.0 typescript@5.9.3
openapi-ts: ## install openapi-typescript, openapi-fetch and typescript (npm) into target/openapi-ts if missing (the generated TypeScript client's test)
	@if [ "$$(cat $(OPENAPI_TS_DIR)/.installed 2>/dev/null)" != "$(OPENAPI_TS_PACKAGES)" ] && command -v npm >/dev/null; then \
	  echo "installing $(OPENAPI_TS_PACKAGES) into $(OPENAPI_TS_DIR) ..."; \
	  npm install --silent --no-audit --no-fund --save-exact --prefix $(OPENAPI_TS_DIR) $(OPENAPI_TS_PACKAGES) && \
	  echo "$(OPENAPI_TS_PACKAGES)" > $(OPENAPI_TS_DIR)/.installed; \
	fi

# localstripe (PyPI), the fake Stripe the Stripe tests run against: a test
# tool only, in a virtual environment of its own, never shipped.
LOCALSTRIPE_VENV := target/localstripe-venv
LOCALSTRIPE_VERSION := 1.15.10
localstripe: ## install localstripe (a fake Stripe, for tests) into target/localstripe-venv if missing
	@if ! $(LOCALSTRIPE_VENV)/bin/python -c 'import localstripe' 2>/dev/null; then \
	  echo "installing localstripe $(LOCALSTRIPE_VERSION) into $(LOCALSTRIPE_VENV) ..."; \
	  python3 -m venv $(LOCALSTRIPE_VENV) && \
	  $(LOCALSTRIPE_VENV)/bin/pip install --quiet localstripe==$(LOCALSTRIPE_VERSION); \
	fi

# PyJWT with cryptography (PyPI): a JOSE implementation nobody here wrote,
# which makes the keys and signs the tokens of the identity tests
# (tests/api/identity.rs, through tests/api/identity_mint.py); a test tool
# only, in a virtual environment of its own, never shipped.
PYJWT_VENV := target/pyjwt-venv
PYJWT_PACKAGES := PyJWT==2.10.1 cryptography==50.0.2
pyjwt: ## install PyJWT and cryptography (token minting, for tests) into target/pyjwt-venv if missing
	@if ! $(PYJWT_VENV)/bin/python -c 'import jwt, cryptography' 2>/dev/null; then \
	  echo "installing $(PYJWT_PACKAGES) into $(PYJWT_VENV) ..."; \
	  python3 -m venv $(PYJWT_VENV) && \
	  $(PYJWT_VENV)/bin/pip install --quiet $(PYJWT_PACKAGES); \
	fi

# This run's databases go WITH (FORCE): what is still connected is this
# run's own. Another run's are dropped only when no one is connected and
# the name says they are older than TEST_DB_STALE_HOURS, and without FORCE:
# a connection that arrives between the look and the drop fails the drop
# (quietly), never the connection. Names of another form (the
# oncepay_test_<uuid> of older checkouts) are left alone.
test-dbs-drop: ## drop this run's test databases (ONCEPAY_TEST_RUN_ID), and other runs' older than $(TEST_DB_STALE_HOURS) h that no one is connected to
	@id="$$ONCEPAY_TEST_RUN_ID"; \
	if [ $${#id} -lt 1 ] || [ $${#id} -gt 16 ] || [ "$$(printf '%s' "$$id" | LC_ALL=C tr -d 'a-z0-9' | wc -c)" -ne 0 ]; then \
	  echo "make test-dbs-drop: ONCEPAY_TEST_RUN_ID=$$ONCEPAY_TEST_RUN_ID: expected 1 to 16 lowercase letters and digits"; exit 1; \
	fi; \
	if [ -z "$(TEST_DB_STALE_HOURS)" ] || [ "$$(printf '%s' '$(TEST_DB_STALE_HOURS)' | LC_ALL=C tr -d '0-9' | wc -c)" -ne 0 ]; then \
	  echo "make test-dbs-drop: TEST_DB_STALE_HOURS=$(TEST_DB_STALE_HOURS): expected a whole number of hours"; exit 1; \
	fi; \
	if command -v psql >/dev/null; then \
	  psql "$(TEST_DATABASE_SERVER)/postgres" -Atqc \
	    "SELECT format('DROP DATABASE IF EXISTS %I WITH (FORCE);', datname) FROM pg_database \
	      WHERE datname LIKE 'oncepay\_test\_$${ONCEPAY_TEST_RUN_ID}\_%'" \
	  | psql "$(TEST_DATABASE_SERVER)/postgres" -q >/dev/null; \
	  psql "$(TEST_DATABASE_SERVER)/postgres" -Atqc \
	    "SELECT format('DROP DATABASE IF EXISTS %I;', d.datname) FROM pg_database d \
	      WHERE d.datname ~ '^oncepay_test_[a-z0-9]{1,16}_[0-9]{10}_[0-9a-f]{20}$$' \
	        AND d.datname NOT LIKE 'oncepay\_test\_$${ONCEPAY_TEST_RUN_ID}\_%' \
	        AND to_timestamp((regexp_match(d.datname, '_([0-9]{10})_[0-9a-f]{20}$$'))[1]::bigint) \
	            < now() - interval '$(TEST_DB_STALE_HOURS) hours' \
	        AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.datid = d.oid)" \
	  | psql "$(TEST_DATABASE_SERVER)/postgres" -q >/dev/null 2>&1; \
	fi

lint: ## formatting and clippy, as CI runs them
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -- -D warnings

fmt: ## format the code
	cargo fmt --all

clean: ## remove build output and the local run folder (not .pgdata/)
	cargo clean
	rm -rf $(RUN_DIR)

BENCH_ARGS ?=
bench: db ## release build, then load oncepay next to the pgbench floor; prints the table and writes BENCHMARKS.md
	$(RELEASE_BUILD)
	target/release/oncepay-bench $(BENCH_ARGS)

CHAOS_ARGS ?=
chaos: ## release build, then the fault soak (2,000 intents; CHAOS_ARGS="--duration 10m" for a soak); prints the invariants
	$(RELEASE_BUILD)
	target/release/oncepay-chaos $(CHAOS_ARGS)

chaos-restore: ## the restore drill: PostgreSQL with WAL archiving destroyed and restored 30-120 s back, 5 times, under load; CHAOS_ARGS="--without-adoption" is the mutation run
	$(RELEASE_BUILD)
	target/release/oncepay-chaos --restore $(CHAOS_ARGS)

ha-packages: ## install Debian's patroni, etcd-server and haproxy if missing (make chaos-ha and the failover test need them)
	@if ! command -v patroni >/dev/null || ! command -v etcd >/dev/null || ! command -v haproxy >/dev/null; then \
	  echo "installing patroni, etcd-server, haproxy (Debian packages) ..."; \
	  DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq patroni etcd-server haproxy >/dev/null; \
	fi

chaos-ha: ha-packages ## the fault soak on PostgreSQL under Patroni (3 nodes, synchronous_mode, etcd, HAProxy) through 12 failovers; CHAOS_ARGS="--async-replication" shows the misconfiguration
	$(RELEASE_BUILD)
	target/release/oncepay-chaos --ha $(CHAOS_ARGS)

fuzz: ## replay each fuzz target's corpus, then fuzz it FUZZ_SECONDS (5) s (cargo fuzz; docs/fuzzing.md)
	fuzz/run.sh replay

fuzz-campaign: ## 10,000,000 executions per fuzz target; merges new inputs into fuzz/corpus/ and writes the figures into docs/fuzzing.md
	fuzz/run.sh campaign
