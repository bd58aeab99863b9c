{{- define "slinky-host.name" -}}slinky-host{{- end }}

{{- define "slinky-host.labels" -}}
app.kubernetes.io/name: slinky-host
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: slinky
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "slinky-host.selector" -}}
app.kubernetes.io/name: slinky-host
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}
