# fnserve's Lambda functions as a container image (PackageType: Image, up to 10 GB): for models too big
# for the zip + layers path (250 MB unzipped in all). One image serves the three functions of template.yaml;
# each picks its handler with ImageConfig.Command:
#   functions/api/app.handler  functions/batch/app.handler  functions/followup/app.handler
#
#   docker build -f infra/container/lambda.Dockerfile -t fnserve-lambda .            # the demo models baked in
#   docker build -f infra/container/lambda.Dockerfile --build-arg MODELS=my/models -t fnserve-lambda .
#   (then push it to ECR and deploy with: make deploy SAM_DEPLOY_ARGS="--parameter-overrides PackageType=Image ImageUri=...")
#
# The base is AWS's Lambda Python image by default; any base with a Python (PYTHON) works, since the image
# brings its own runtime interface client (awslambdaric) and starts it itself. The models land at
# /opt/models, where the zip path's models layer is mounted, so the functions' settings are the same.

ARG BASE=public.ecr.aws/lambda/python:3.12
ARG PYTHON=python3.12

# hadolint ignore=DL3006
FROM ${BASE} AS build
ARG PYTHON
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY infra/container/lambda-requirements.lock infra/container/
COPY layers/fnserve/fnserve layers/fnserve/fnserve
# What the zip path's runtime layer holds (fnserve[lambda]), boto3 (which Lambda's runtime provides to zip
# functions only) and the runtime interface client, into /opt/python as a layer would be, at the versions the
# lock holds (make locks) and `make image-test` ran; then fnserve itself, resolving nothing again. Bytecode is
# compiled here: Lambda's file system is read-only, so without it every cold start compiles every module.
# pip runs from a virtualenv of its own: a distribution's Python may have no pip, or refuse installs (PEP 668).
RUN ${PYTHON} -m venv /opt/build \
    && /opt/build/bin/pip install --no-cache-dir --target /opt/python -r infra/container/lambda-requirements.lock \
    && /opt/build/bin/pip install --no-cache-dir --no-deps --target /opt/python . \
    && rm -rf /opt/python/numpy/*/tests /opt/python/bin \
    && ${PYTHON} -m compileall -q --invalidation-mode unchecked-hash /opt/python

# hadolint ignore=DL3006
FROM ${BASE}
ARG PYTHON
ARG MODELS=layers/models/models
COPY --from=build /opt/python /opt/python
COPY ${MODELS}/ /opt/models/
WORKDIR /var/task
COPY functions/api/app.py functions/api/app.py
COPY functions/batch/app.py functions/batch/app.py
COPY functions/followup/app.py functions/followup/app.py
# The interpreter under one fixed name, for the exec-form ENTRYPOINT (which expands no build argument).
RUN mkdir -p /opt/fnserve/bin \
    && ln -s "$(command -v ${PYTHON})" /opt/fnserve/bin/python \
    && /opt/fnserve/bin/python -m compileall -q --invalidation-mode unchecked-hash /var/task
ENV PYTHONPATH=/opt/python \
    PYTHONUNBUFFERED=1 \
    FNSERVE_MANIFEST=/opt/models/manifest.toml
ENTRYPOINT ["/opt/fnserve/bin/python", "-m", "awslambdaric"]
CMD ["functions/api/app.handler"]
