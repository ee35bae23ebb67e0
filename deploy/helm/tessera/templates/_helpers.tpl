{{/* The chart's name (app.kubernetes.io/name). */}}
{{- define "tessera.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* The prefix of every object's name: the release name when it contains the chart's name. */}}
{{- define "tessera.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- $name := include "tessera.name" . -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 50 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 50 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "tessera.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride -}}
{{- end -}}

{{- define "tessera.serviceAccountName" -}}
{{- default (include "tessera.fullname" .) .Values.scheduler.serviceAccountName -}}
{{- end -}}

{{/* Labels of every object: deploy/base's part-of, Helm's own, and global.labels. */}}
{{- define "tessera.labels" -}}
app.kubernetes.io/part-of: tessera
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
{{- with .Values.global.labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* global.annotations as metadata's annotations (nothing when there are none). */}}
{{- define "tessera.annotations" -}}
{{- with .Values.global.annotations }}
  annotations:
    {{- toYaml . | nindent 4 }}
{{- end }}
{{- end -}}

{{/* The scheduler pods' selector labels. */}}
{{- define "tessera.selectorLabels" -}}
app.kubernetes.io/name: {{ include "tessera.name" . }}
app.kubernetes.io/component: hami-scheduler
{{- end -}}

{{/*
An image reference. Args: dict "root" . "image" IMAGE "tag" DEFAULT-TAG. IMAGE is HAMi v2.10's
map (registry, repository, tag; global.imageRegistry replaces the registry) or HAMi v2.5's string
(a repository, or a reference with its tag, used as it is).
*/}}
{{- define "tessera.image" -}}
{{- if kindIs "string" .image -}}
{{- $last := last (splitList "/" .image) -}}
{{- if or (contains ":" $last) (contains "@" $last) -}}{{ .image }}{{- else -}}{{ .image }}:{{ .tag }}{{- end -}}
{{- else -}}
{{- $registry := default .image.registry .root.Values.global.imageRegistry -}}
{{- if $registry -}}{{ $registry }}/{{- end -}}{{ .image.repository }}:{{ default .tag .image.tag }}
{{- end -}}
{{- end -}}

{{/* imagePullPolicy of a component (v2.10: image.pullPolicy; v2.5: imagePullPolicy beside image). */}}
{{- define "tessera.pullPolicy" -}}
{{- if kindIs "map" .image -}}{{ .image.pullPolicy | default "" }}{{- else -}}{{ .imagePullPolicy | default "" }}{{- end -}}
{{- end -}}

{{/* pullSecrets of a component's image (v2.10's map form only). */}}
{{- define "tessera.imagePullSecrets" -}}
{{- if kindIs "map" .image -}}{{ toJson (.image.pullSecrets | default list) }}{{- else -}}[]{{- end -}}
{{- end -}}

{{/* kube-scheduler's tag: the value, else the cluster's version without its build suffix. */}}
{{- define "tessera.kubeSchedulerTag" -}}
{{- $ks := .Values.scheduler.kubeScheduler -}}
{{- $tag := $ks.imageTag -}}
{{- if kindIs "map" $ks.image }}{{ $tag = $ks.image.tag }}{{ end -}}
{{- if $tag -}}
{{- $tag | toString | trim -}}
{{- else -}}
{{- regexReplaceAll "^(v[0-9]+\\.[0-9]+\\.[0-9]+).*$" .Capabilities.KubeVersion.Version "${1}" -}}
{{- end -}}
{{- end -}}

{{/* The port of a host:port address. */}}
{{- define "tessera.portOf" -}}
{{- regexReplaceAll "^.*:([0-9]+)$" . "${1}" -}}
{{- end -}}

{{/* imagePullSecrets of the pods: global's and every image's pullSecrets. */}}
{{- define "tessera.pullSecrets" -}}
{{- $ks := include "tessera.imagePullSecrets" .Values.scheduler.kubeScheduler | fromJsonArray -}}
{{- $ext := include "tessera.imagePullSecrets" .Values.scheduler.extender | fromJsonArray -}}
{{- $secrets := concat .Values.global.imagePullSecrets $ks $ext | uniq -}}
{{- with $secrets }}
imagePullSecrets:
{{- range . }}
  - name: {{ . }}
{{- end }}
{{- end }}
{{- end -}}

{{/* How the serving certificate is made: certManager, patch (certgen Jobs) or none (your Secret). */}}
{{- define "tessera.tlsSource" -}}
{{- if .Values.scheduler.certManager.enabled -}}certManager
{{- else if .Values.scheduler.patch.enabled -}}patch
{{- else -}}none
{{- end -}}
{{- end -}}
