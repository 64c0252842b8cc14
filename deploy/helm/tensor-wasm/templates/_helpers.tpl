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

{{/* One replica at most: state is on one local volume, no shared store yet. */}}
{{- define "tensor-wasm.checkReplicas" -}}
{{- if gt (int .Values.replicaCount) 1 }}
{{- fail (printf "replicaCount=%d is not supported: tensor-wasm keeps its state (functions, modules, tenants, tokens) on one ReadWriteOnce volume and has no shared store yet, so it runs as a single replica (replicaCount 0 or 1)" (int .Values.replicaCount)) }}
{{- end }}
{{- if lt (int .Values.replicaCount) 0 }}
{{- fail "replicaCount must be 0 or 1" }}
{{- end }}
{{- end }}
