{{/* Names, labels and shared values of the tensor-wasm chart. */}}

{{- define "tensor-wasm.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "tensor-wasm.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "tensor-wasm.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tensor-wasm.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "tensor-wasm.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "tensor-wasm.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The image reference: tag, or appVersion (+ "-cpu" without GPUs). */}}
{{- define "tensor-wasm.image" -}}
{{- $tag := .Values.image.tag }}
{{- if not $tag }}
{{- $tag = .Chart.AppVersion }}
{{- if not .Values.gpu.enabled }}
{{- $tag = printf "%s-cpu" $tag }}
{{- end }}
{{- end }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}

{{- define "tensor-wasm.device" -}}
{{- if .Values.config.device }}
{{- .Values.config.device }}
{{- else if .Values.gpu.enabled }}
{{- "cuda" }}
{{- else }}
{{- "cpu" }}
{{- end }}
{{- end }}

{{- define "tensor-wasm.metricsSecretName" -}}
{{- if .Values.metrics.token.existingSecret }}
{{- .Values.metrics.token.existingSecret }}
{{- else }}
{{- printf "%s-metrics" (include "tensor-wasm.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "tensor-wasm.claimName" -}}
{{- if .Values.persistence.existingClaim }}
{{- .Values.persistence.existingClaim }}
{{- else }}
{{- printf "%s-data" (include "tensor-wasm.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* Several replicas only over the shared store; its settings complete. */}}
{{- define "tensor-wasm.checkReplicas" -}}
{{- $shared := .Values.sharedStore.enabled }}
{{- if and (gt (int .Values.replicaCount) 1) (not $shared) }}
{{- fail (printf "replicaCount=%d needs sharedStore.enabled: without the shared store tensor-wasm keeps its state (functions, modules, tenants, tokens, jobs) on one ReadWriteOnce volume and runs as a single replica (replicaCount 0 or 1)" (int .Values.replicaCount)) }}
{{- end }}
{{- if lt (int .Values.replicaCount) 0 }}
{{- fail "replicaCount must not be negative" }}
{{- end }}
{{- if $shared }}
{{- if not .Values.sharedStore.blobStore.url }}
{{- fail "sharedStore.enabled needs sharedStore.blobStore.url (s3://bucket/prefix)" }}
{{- end }}
{{- if not (hasPrefix "s3://" .Values.sharedStore.blobStore.url) }}
{{- fail "sharedStore.blobStore.url must be s3://bucket[/prefix]" }}
{{- end }}
{{- if and (not .Values.sharedStore.database.url) (not .Values.sharedStore.database.existingSecret) }}
{{- fail "sharedStore.enabled needs sharedStore.database.url or sharedStore.database.existingSecret" }}
{{- end }}
{{- $creds := .Values.sharedStore.blobStore.credentials }}
{{- if ne (not $creds.accessKeyId) (not $creds.secretAccessKey) }}
{{- fail "sharedStore.blobStore.credentials: set both accessKeyId and secretAccessKey, or neither" }}
{{- end }}
{{- if not (has .Values.sharedStore.antiAffinity (list "" "preferred" "required")) }}
{{- fail "sharedStore.antiAffinity must be \"\", \"preferred\" or \"required\"" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The Secret holding the shared store's database URL. */}}
{{- define "tensor-wasm.storeSecretName" -}}
{{- if .Values.sharedStore.database.existingSecret }}
{{- .Values.sharedStore.database.existingSecret }}
{{- else }}
{{- printf "%s-store" (include "tensor-wasm.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{/* The Secret holding the object store's keys (none: the pod's identity). */}}
{{- define "tensor-wasm.blobSecretName" -}}
{{- $creds := .Values.sharedStore.blobStore.credentials }}
{{- if $creds.existingSecret }}
{{- $creds.existingSecret }}
{{- else if $creds.accessKeyId }}
{{- printf "%s-store" (include "tensor-wasm.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
