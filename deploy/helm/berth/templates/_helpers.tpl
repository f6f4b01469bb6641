{{/* Names, labels and the values several templates share. */}}

{{- define "berth.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else if contains "berth" .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-berth" .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "berth.selectorLabels" -}}
app.kubernetes.io/name: berth
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "berth.labels" -}}
{{ include "berth.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "berth.image" -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}

{{- define "berth.serviceAccountName" -}}
{{- .Values.serviceAccount.name | default (include "berth.fullname" .) -}}
{{- end -}}

{{/* The Secret holding BERTH_KEK and the node token. */}}
{{- define "berth.secretName" -}}
{{- .Values.secrets.existingSecret | default (printf "%s-keys" (include "berth.fullname" .)) -}}
{{- end -}}

{{/*
The Secret and key holding the database URL: the operator's (database.existingSecret),
the one made from database.url, or the dev Postgres's. Exactly one source is allowed.
*/}}
{{- define "berth.databaseSources" -}}
{{- $sources := list -}}
{{- if .Values.database.url }}{{ $sources = append $sources "database.url" }}{{ end -}}
{{- if .Values.database.existingSecret }}{{ $sources = append $sources "database.existingSecret" }}{{ end -}}
{{- if .Values.postgres.enabled }}{{ $sources = append $sources "postgres.enabled" }}{{ end -}}
{{- if eq (len $sources) 0 -}}
{{- fail "berth needs Postgres: set database.url, or database.existingSecret (a Secret holding the URL), or postgres.enabled=true (a dev-only in-cluster Postgres)" -}}
{{- else if gt (len $sources) 1 -}}
{{- fail (printf "set only one database source, not %s" (join " and " $sources)) -}}
{{- end -}}
{{- end -}}

{{- define "berth.databaseSecretName" -}}
{{- include "berth.databaseSources" . -}}
{{- if .Values.database.existingSecret -}}
{{- .Values.database.existingSecret -}}
{{- else if .Values.postgres.enabled -}}
{{- printf "%s-postgres" (include "berth.fullname" .) -}}
{{- else -}}
{{- printf "%s-database" (include "berth.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "berth.databaseSecretKey" -}}
{{- if .Values.database.existingSecret -}}
{{- .Values.database.existingSecretKey -}}
{{- else -}}
url
{{- end -}}
{{- end -}}

{{/* Environment both roles get: the database URL, the KEK, any extra. */}}
{{- define "berth.commonEnv" -}}
- name: BERTH_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "berth.databaseSecretName" . }}
      key: {{ include "berth.databaseSecretKey" . }}
- name: BERTH_KEK
  valueFrom:
    secretKeyRef:
      name: {{ include "berth.secretName" . }}
      key: {{ .Values.secrets.kekKey }}
{{- end -}}

{{/* The node token as the file both roles read (--node-token-file). */}}
{{- define "berth.nodeTokenVolume" -}}
- name: node-token
  secret:
    secretName: {{ include "berth.secretName" . }}
    defaultMode: 0440
    items:
      - key: {{ .Values.secrets.nodeTokenKey }}
        path: node-token
{{- end -}}

{{/* Prometheus scrape annotations for a pod serving /metrics on `port`. */}}
{{- define "berth.scrapeAnnotations" -}}
prometheus.io/scrape: "true"
prometheus.io/port: {{ .port | quote }}
prometheus.io/path: /metrics
{{- end -}}
