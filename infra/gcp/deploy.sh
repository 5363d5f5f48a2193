#!/usr/bin/env bash
# Deploy fnserve to Google Cloud as Cloud Run functions (2nd gen): the V2 HTTP function, the Pub/Sub
# job function and the cascade follow-up function, with their topics, a dead-letter topic, a
# signing secret and a service account holding only what they use.
#
#   infra/gcp/deploy.sh --project P --redis redis://10.0.0.3:6379/0 --vpc-connector fnserve \
#       --bucket gs://P-fnserve [--region us-central1] [--models gs://P-models/demo/manifest.toml] [--dry-run]
#
# --dry-run stages the sources and prints every gcloud command instead of running it.
# Results live in Redis (Memorystore, reached through a Serverless VPC Access connector); the
# bucket holds job inputs and results too big for a message or a Redis value.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${BUILD:-$ROOT/.gcp-build}

PROJECT=${PROJECT:-}
REGION=${REGION:-us-central1}
NAME=${NAME:-fnserve}
RUNTIME=python312
MEMORY=${MEMORY:-2Gi}
CPU=${CPU:-2}
MIN_INSTANCES=${MIN_INSTANCES:-0}          # 1+ keeps a warm instance (no cold start), billed when idle
MAX_INSTANCES=${MAX_INSTANCES:-20}
CONCURRENCY=${CONCURRENCY:-16}             # requests an HTTP instance takes at once
API_TIMEOUT=${API_TIMEOUT:-60}              # seconds an HTTP request may take (gcloud's default)
JOBS_TIMEOUT=${JOBS_TIMEOUT:-540}           # seconds a push of jobs may take (the most an event function has)
JOBS_CONCURRENCY=${JOBS_CONCURRENCY:-80}   # events a job instance takes at once: they are run as batches
MAX_DELIVERY_ATTEMPTS=${MAX_DELIVERY_ATTEMPTS:-5}
REDIS=${REDIS:-}
VPC_CONNECTOR=${VPC_CONNECTOR:-}
BUCKET=${BUCKET:-}
MODELS=${MODELS:-}                          # gs://.../manifest.toml; unset: the demo models, in the source
PUBLIC=${PUBLIC:-0}                         # 1: the HTTP function answers unauthenticated callers
DRY_RUN=${DRY_RUN:-0}

usage() {
    sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'
    echo "options (or the variables of the same name): --project --region --name --memory --cpu --min-instances"
    echo "  --max-instances --concurrency --jobs-concurrency --max-delivery-attempts --redis --vpc-connector"
    echo "  --bucket --models --public --dry-run"
    echo "PYTHON: the interpreter whose pip builds fnserve's wheel (python3)"
}

while [ $# -gt 0 ]; do
    case "$1" in
        --project) PROJECT=$2; shift ;;
        --region) REGION=$2; shift ;;
        --name) NAME=$2; shift ;;
        --memory) MEMORY=$2; shift ;;
        --cpu) CPU=$2; shift ;;
        --min-instances) MIN_INSTANCES=$2; shift ;;
        --max-instances) MAX_INSTANCES=$2; shift ;;
        --concurrency) CONCURRENCY=$2; shift ;;
        --jobs-concurrency) JOBS_CONCURRENCY=$2; shift ;;
        --max-delivery-attempts) MAX_DELIVERY_ATTEMPTS=$2; shift ;;
        --redis) REDIS=$2; shift ;;
        --vpc-connector) VPC_CONNECTOR=$2; shift ;;
        --bucket) BUCKET=$2; shift ;;
        --models) MODELS=$2; shift ;;
        --public) PUBLIC=1 ;;
        --dry-run) DRY_RUN=1 ;;
        -h|--help) usage; exit 0 ;;
        *) echo "unknown option: $1" >&2; usage >&2; exit 2 ;;
    esac
    shift
done

fail() { echo "deploy: $*" >&2; exit 2; }
[ -n "$PROJECT" ] || fail "--project is required"
[ -n "$REDIS" ] || fail "--redis is required: the Redis URL of the results (Memorystore: redis://IP:6379/0)"
case "$REDIS" in redis://*|rediss://*) ;; *) fail "--redis must be a redis:// or rediss:// URL" ;; esac
[ -z "$BUCKET" ] || case "$BUCKET" in gs://*) ;; *) fail "--bucket must be gs://NAME" ;; esac
[ -z "$MODELS" ] || case "$MODELS" in gs://*.toml) ;; *) fail "--models must be gs://BUCKET/.../manifest.toml" ;; esac
[ "$MAX_DELIVERY_ATTEMPTS" -ge 5 ] && [ "$MAX_DELIVERY_ATTEMPTS" -le 100 ] \
    || fail "--max-delivery-attempts must be 5-100 (Pub/Sub's dead-letter bounds)"

run() {
    if [ "$DRY_RUN" = 1 ]; then
        printf '%q ' "$@" | sed 's/ $//'
        echo
    else
        "$@"
    fi
}

# Idempotent creates: a second deploy reuses what the first made.
exists() { [ "$DRY_RUN" != 1 ] && "$@" >/dev/null 2>&1; }

# fnserve itself as a wheel built from this checkout: the functions install it with its gcp extra at the versions
# locked in infra/gcp/requirements.lock (make locks compiles it from pyproject's ranges), so what deploys is what
# the tests ran, never a list kept by hand beside it nor whatever the index holds that day. Built from a fresh copy of what the build
# reads, not in the checkout: there setuptools reuses build/lib, and a module deleted since an earlier build
# would still ship in the wheel.
WHEEL_DIR=$BUILD/wheel
SRC=$BUILD/src
rm -rf "$WHEEL_DIR" "$SRC"
mkdir -p "$WHEEL_DIR" "$SRC/layers/fnserve"
cp "$ROOT/pyproject.toml" "$ROOT/README.md" "$ROOT/LICENSE" "$SRC/"
cp -R "$ROOT/layers/fnserve/fnserve" "$SRC/layers/fnserve/fnserve"
find "$SRC" -name __pycache__ -type d -prune -exec rm -rf {} +
${PYTHON:-python3} -m pip wheel --quiet --no-deps --wheel-dir "$WHEEL_DIR" "$SRC" >&2
rm -rf "$SRC"
WHEEL=$(cd "$WHEEL_DIR" && ls fnserve-*.whl)

stage() {  # stage NAME: the function's source, as Cloud Functions builds it (main.py, requirements.txt)
    local dir=$BUILD/$1
    rm -rf "$dir"
    mkdir -p "$dir"
    cp "$ROOT/functions/gcp_$1/main.py" "$dir/main.py"
    cp "$WHEEL_DIR/$WHEEL" "$dir/$WHEEL"
    # pip, in Cloud Functions' build, reads it in the source folder: the locked versions, then the wheel.
    { cat "$ROOT/infra/gcp/requirements.lock"; echo "./$WHEEL[gcp]"; } > "$dir/requirements.txt"
    if [ -z "$MODELS" ]; then
        cp -R "$ROOT/layers/models/models" "$dir/models"
    fi
    find "$dir" -name __pycache__ -type d -prune -exec rm -rf {} +
    echo "staged $dir ($(du -sh "$dir" | cut -f1))" >&2
}

SA=$NAME-functions@$PROJECT.iam.gserviceaccount.com
JOBS_TOPIC=$NAME-jobs
FOLLOWUP_TOPIC=$NAME-followups
DEAD_LETTER_TOPIC=$NAME-dead-letter
SECRET=$NAME-result-id-key
MANIFEST=${MODELS:-/workspace/models/manifest.toml}  # the source lands in /workspace

stage api
stage jobs

# The service account the functions run as, and the roles each use needs, on that resource only.
if ! exists gcloud iam service-accounts describe "$SA" --project "$PROJECT"; then
    run gcloud iam service-accounts create "$NAME-functions" --project "$PROJECT" \
        --display-name "fnserve functions"
fi
for topic in "$JOBS_TOPIC" "$FOLLOWUP_TOPIC" "$DEAD_LETTER_TOPIC"; do
    if ! exists gcloud pubsub topics describe "$topic" --project "$PROJECT"; then
        run gcloud pubsub topics create "$topic" --project "$PROJECT"
    fi
done
# The HTTP function publishes follow-ups; nothing else.
run gcloud pubsub topics add-iam-policy-binding "$FOLLOWUP_TOPIC" --project "$PROJECT" \
    --member "serviceAccount:$SA" --role roles/pubsub.publisher
# Eventarc delivers events to the functions as this account.
run gcloud projects add-iam-policy-binding "$PROJECT" --member "serviceAccount:$SA" \
    --role roles/eventarc.eventReceiver --condition None
if [ -n "$BUCKET" ]; then  # inputs and results by reference: read and write objects, no bucket admin
    run gcloud storage buckets add-iam-policy-binding "$BUCKET" --member "serviceAccount:$SA" \
        --role roles/storage.objectUser
fi
if [ -n "$MODELS" ]; then  # the models: read only
    models_bucket=gs://$(echo "${MODELS#gs://}" | cut -d/ -f1)
    run gcloud storage buckets add-iam-policy-binding "$models_bucket" --member "serviceAccount:$SA" \
        --role roles/storage.objectViewer
fi
# The key signing follow-up ids: random, in Secret Manager, readable by the functions only.
if ! exists gcloud secrets describe "$SECRET" --project "$PROJECT"; then
    run gcloud secrets create "$SECRET" --project "$PROJECT" --replication-policy automatic
    if [ "$DRY_RUN" = 1 ]; then
        run gcloud secrets versions add "$SECRET" --project "$PROJECT" --data-file -
    else
        head -c 32 /dev/urandom | base64 | gcloud secrets versions add "$SECRET" --project "$PROJECT" --data-file -
    fi
fi
run gcloud secrets add-iam-policy-binding "$SECRET" --project "$PROJECT" --member "serviceAccount:$SA" \
    --role roles/secretmanager.secretAccessor

ENV="FNSERVE_MANIFEST=$MANIFEST,FNSERVE_RESULTS=$REDIS,FNSERVE_FOLLOWUP_TOPIC=projects/$PROJECT/topics/$FOLLOWUP_TOPIC"
ENV="$ENV,FNSERVE_MAX_RECEIVE_COUNT=$MAX_DELIVERY_ATTEMPTS,GOOGLE_CLOUD_PROJECT=$PROJECT"
[ -z "$BUCKET" ] || ENV="$ENV,FNSERVE_RESULTS_BUCKET=$BUCKET"
COMMON=(--project "$PROJECT" --region "$REGION" --gen2 --runtime "$RUNTIME" --memory "$MEMORY" --cpu "$CPU"
    --min-instances "$MIN_INSTANCES" --max-instances "$MAX_INSTANCES" --service-account "$SA"
    --set-secrets "FNSERVE_RESULT_ID_KEY=$SECRET:latest")
[ -z "$VPC_CONNECTOR" ] || COMMON+=(--vpc-connector "$VPC_CONNECTOR" --egress-settings private-ranges-only)

AUTH=(--no-allow-unauthenticated)
[ "$PUBLIC" = 1 ] && AUTH=(--allow-unauthenticated)
# Each function's timeout is what its work is foreseen against (FNSERVE_REQUEST_TIMEOUT_SECONDS): a request past it
# is refused at once instead of cut off, a push of jobs hands back (503) the jobs it cannot reach in it.
run gcloud functions deploy "$NAME-api" "${COMMON[@]}" --source "$BUILD/api" --entry-point infer \
    --trigger-http "${AUTH[@]}" --concurrency "$CONCURRENCY" --timeout "$API_TIMEOUT" \
    --set-env-vars "$ENV,FNSERVE_REQUEST_TIMEOUT_SECONDS=$API_TIMEOUT"

# Pub/Sub's own agent forwards undeliverable messages: it publishes to the dead-letter topic and
# acknowledges on the functions' subscriptions (bound on each, below).
if [ "$DRY_RUN" = 1 ]; then
    number=PROJECT_NUMBER
else
    number=$(gcloud projects describe "$PROJECT" --format 'value(projectNumber)')
fi
agent=serviceAccount:service-$number@gcp-sa-pubsub.iam.gserviceaccount.com
run gcloud pubsub topics add-iam-policy-binding "$DEAD_LETTER_TOPIC" --project "$PROJECT" \
    --member "$agent" --role roles/pubsub.publisher

# The job functions: retried on failure (a 503 is a nack), their subscriptions dead-lettered.
for fn in jobs followups; do
    topic=$JOBS_TOPIC
    [ "$fn" = followups ] && topic=$FOLLOWUP_TOPIC
    run gcloud functions deploy "$NAME-$fn" "${COMMON[@]}" --source "$BUILD/jobs" --entry-point jobs \
        --trigger-topic "$topic" --trigger-service-account "$SA" --retry --concurrency "$JOBS_CONCURRENCY" \
        --timeout "$JOBS_TIMEOUT" --set-env-vars "$ENV,FNSERVE_REQUEST_TIMEOUT_SECONDS=$JOBS_TIMEOUT"
    run gcloud run services add-iam-policy-binding "$NAME-$fn" --project "$PROJECT" --region "$REGION" \
        --member "serviceAccount:$SA" --role roles/run.invoker
    if [ "$DRY_RUN" = 1 ]; then
        subscription="SUBSCRIPTION-OF-$NAME-$fn"
    else
        trigger=$(gcloud functions describe "$NAME-$fn" --project "$PROJECT" --region "$REGION" --gen2 \
            --format 'value(eventTrigger.trigger)')
        subscription=$(gcloud eventarc triggers describe "$trigger" --format 'value(transport.pubsub.subscription)')
    fi
    run gcloud pubsub subscriptions update "$subscription" --dead-letter-topic "$DEAD_LETTER_TOPIC" \
        --dead-letter-topic-project "$PROJECT" --max-delivery-attempts "$MAX_DELIVERY_ATTEMPTS" \
        --min-retry-delay 10s --max-retry-delay 600s
    run gcloud pubsub subscriptions add-iam-policy-binding "$subscription" --project "$PROJECT" \
        --member "$agent" --role roles/pubsub.subscriber
done

echo "deployed: $NAME-api (HTTP), $NAME-jobs <- projects/$PROJECT/topics/$JOBS_TOPIC," \
    "$NAME-followups <- projects/$PROJECT/topics/$FOLLOWUP_TOPIC; dead letters: $DEAD_LETTER_TOPIC" >&2
echo "submit jobs: fnserve submit DATA --model MODEL --topic projects/$PROJECT/topics/$JOBS_TOPIC --ids ids.txt" >&2
