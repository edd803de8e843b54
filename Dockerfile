# The portal image: one image, three roles (web on daphne, Celery worker, Celery beat), chosen by the command.
FROM python:3.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PORTAL_ENV=production
RUN apt-get update && apt-get install -y --no-install-recommends gettext && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY requirements.txt .
RUN pip install --no-cache-dir -r requirements.txt
COPY . .
# collectstatic needs settings but no real secrets or servers.
RUN SECRET_KEY=build-only-collectstatic-key-not-used-at-runtime-0123456789 \
    DATABASE_URL=postgres://build@localhost/build REDIS_URL=redis://localhost:6379/0 ALLOWED_HOSTS=build \
    python manage.py collectstatic --noinput
# The recordings directory exists in the image, owned by the portal's user: docker-compose mounts a named volume
# there, and a new volume takes the ownership of the directory it is mounted on (root, were it missing).
RUN useradd --system --home /app portal && mkdir -p /app/var/recordings && chown -R portal /app/var
USER portal
EXPOSE 8000
CMD ["daphne", "--bind", "0.0.0.0", "--port", "8000", "--proxy-headers", "ops.asgi:application"]
