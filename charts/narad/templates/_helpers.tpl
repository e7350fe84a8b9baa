{{/* Chart name. */}}
{{- define "narad.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: <release>-narad (or the release name when it already contains it). */}}
{{- define "narad.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The fixed selector labels: never user labels (selector and volumeClaimTemplates). */}}
{{- define "narad.selectorLabels" -}}
app.kubernetes.io/name: {{ include "narad.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels on every object. */}}
{{- define "narad.labels" -}}
{{ include "narad.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "narad.headless" -}}
{{ include "narad.fullname" . }}-headless
{{- end -}}

{{- define "narad.securitySecret" -}}
{{- default (printf "%s-security" (include "narad.fullname" .)) .Values.security.existingSecret -}}
{{- end -}}

{{- define "narad.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "narad.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Labels of the `helm test` pods: not the brokers' selector labels, so neither the
Services nor the PodDisruptionBudget count a test pod (a failed one stays behind). */}}
{{- define "narad.testLabels" -}}
app.kubernetes.io/name: {{ include "narad.name" . }}-test
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: test
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* Whole seconds, rounded up, of a Go duration string (5s, 1m30s, 500ms). */}}
{{- define "narad.durationSeconds" -}}
{{- $ms := 0.0 -}}
{{- $units := dict "ms" 1 "s" 1000 "m" 60000 "h" 3600000 -}}
{{- range $part := regexFindAll "[0-9]+(\\.[0-9]+)?(ms|h|m|s)" . -1 -}}
{{- $n := float64 (regexFind "^[0-9]+(\\.[0-9]+)?" $part) -}}
{{- $unit := regexReplaceAll "^[0-9]+(\\.[0-9]+)?" $part "" -}}
{{- $ms = addf $ms (mulf $n (get $units $unit)) -}}
{{- end -}}
{{- ceil (divf $ms 1000) | int -}}
{{- end -}}

{{/* The broker's graceful HTTP shutdown (http.shutdown_grace of narad.config, else its
default of 10s). */}}
{{- define "narad.shutdownGrace" -}}
{{- dig "http" "shutdown_grace" "10s" .Values.narad.config -}}
{{- end -}}

{{/* terminationGracePeriodSeconds: the shutdown delay (readiness fails, the node keeps
serving until the Services stopped routing to it), then the graceful HTTP shutdown, then
a 15 s margin (Raft leadership handoff, last flush), so the kubelet never kills a broker
in the middle of its orderly shutdown. */}}
{{- define "narad.terminationGracePeriodSeconds" -}}
{{- $delay := include "narad.durationSeconds" .Values.narad.shutdownDelay | int -}}
{{- $grace := include "narad.durationSeconds" (include "narad.shutdownGrace" .) | int -}}
{{- add $delay $grace 15 -}}
{{- end -}}

{{/* Peers: the first initialClusterSize ordinals only, so scaling never changes the pods. */}}
{{- define "narad.peers" -}}
{{- $full := include "narad.fullname" . -}}
{{- $host := printf "%s.%s.svc.%s" (include "narad.headless" .) .Release.Namespace .Values.clusterDomain -}}
{{- $peers := list -}}
{{- range $i := until (int .Values.initialClusterSize) -}}
{{- $peers = append $peers (printf "%s-%d@%s-%d.%s:%d" $full $i $full $i $host (int $.Values.service.ports.cluster)) -}}
{{- end -}}
{{- join "," $peers -}}
{{- end -}}

{{- define "narad.initialMembers" -}}
{{- $full := include "narad.fullname" . -}}
{{- $ids := list -}}
{{- range $i := until (int .Values.initialClusterSize) -}}
{{- $ids = append $ids (printf "%s-%d" $full $i) -}}
{{- end -}}
{{- join "," $ids -}}
{{- end -}}

{{/* Fails on shapes the broker refuses. */}}
{{- define "narad.validate" -}}
{{- $n := int .Values.replicaCount -}}
{{- $i := int .Values.initialClusterSize -}}
{{- if eq (mod $i 2) 0 -}}
{{- fail "initialClusterSize must be odd" -}}
{{- end -}}
{{- if gt $i $n -}}
{{- fail "initialClusterSize must be <= replicaCount" -}}
{{- end -}}
{{- if and (ne $n 1) (lt $n 3) -}}
{{- fail "replicaCount must be 1 or >= 3" -}}
{{- end -}}
{{- if and .Values.security.clusterTLS.enabled (not .Values.security.clusterTLS.secretName) -}}
{{- fail "security.clusterTLS.secretName is required when clusterTLS is enabled" -}}
{{- end -}}
{{- if and .Values.ingress.enabled (not .Values.ingress.host) -}}
{{- fail "ingress.host is required when the ingress is enabled" -}}
{{- end -}}
{{- end -}}
