# Shortcuts; the README's two commands are bin/run and bin/test.
.PHONY: run test lint bench messages

run:
	bin/run

test:
	bin/test

lint:
	.venv/bin/ruff check .
	.venv/bin/ruff format --check .
	.venv/bin/lint-imports
	PORTAL_ENV=test .venv/bin/mypy

bench:
	bin/setup && .venv/bin/python -m bench

messages:
	.venv/bin/python manage.py makemessages -l ja --ignore=.venv --ignore=static/vendor --ignore=kubesim --ignore=guest
	.venv/bin/python manage.py makemessages -d djangojs -l ja --ignore=.venv --ignore=static/vendor --ignore=staticfiles
	.venv/bin/python manage.py compilemessages --ignore=.venv
