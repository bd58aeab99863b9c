{{/* The chart's name, or .Values.nameOverride. */}}
{{- define "slinky-host.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release's full name: .Values.fullnameOverride, else the release name when it already contains
the chart name, else "<release>-<chart>"; at most 63 characters (a DNS label).
*/}}
{{- define "slinky-host.fullname" -}}
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

{{- define "slinky-host.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels of every object. */}}
{{- define "slinky-host.labels" -}}
helm.sh/chart: {{ include "slinky-host.chart" . }}
{{ include "slinky-host.selector" . }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: slinky
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{/* The labels that select the release's pods. */}}
{{- define "slinky-host.selector" -}}
app.kubernetes.io/name: {{ include "slinky-host.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/* The ServiceAccount the pods run as. */}}
{{- define "slinky-host.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "slinky-host.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}
