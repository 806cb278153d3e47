{{/* <fullname>: the release name when it contains the chart's name, else <release>-<chart>. */}}
{{- define "tensile.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 40 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "tensile.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ default .Chart.Name .Values.nameOverride }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* Selector labels of one part: pass (list $ "part"). */}}
{{- define "tensile.selectorLabels" -}}
{{- $ := index . 0 -}}
app.kubernetes.io/name: {{ default $.Chart.Name $.Values.nameOverride }}
app.kubernetes.io/instance: {{ $.Release.Name }}
app.kubernetes.io/component: {{ index . 1 }}
{{- end -}}

{{- define "tensile.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* The pod-level fields every program shares: pass (list $ .Values.<part>). */}}
{{- define "tensile.podCommon" -}}
{{- $ := index . 0 -}}
{{- $part := index . 1 -}}
securityContext:
  {{- toYaml $.Values.podSecurityContext | nindent 2 }}
{{- with $.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $part.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $part.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $part.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Required node affinity away from virtual nodes (their label type=virtual-kubelet). */}}
{{- define "tensile.nodeAffinity" -}}
{{- if .Values.avoidVirtualNodes }}
nodeAffinity:
  requiredDuringSchedulingIgnoredDuringExecution:
    nodeSelectorTerms:
    - matchExpressions:
      - {key: type, operator: NotIn, values: [virtual-kubelet]}
{{- end }}
{{- end -}}

{{/* The avoidance record the descheduler writes and the webhook reads (NAMESPACE/NAME). */}}
{{- define "tensile.avoidConfigMap" -}}
{{ include "tensile.fullname" . }}-avoid
{{- end -}}

{{/* A container's env from layers of EnvVar lists, earliest first: pass (list <own>
<common> <particular>). An entry replaces an earlier one of the same name, in the earlier
one's place (so `$(VAR)` references to it still come after it); the rest keep their order. */}}
{{- define "tensile.mergeEnv" -}}
{{- $order := list -}}
{{- $byName := dict -}}
{{- range $layer := . -}}
{{- range $layer -}}
{{- if not (hasKey $byName .name) -}}
{{- $order = append $order .name -}}
{{- end -}}
{{- $_ := set $byName .name . -}}
{{- end -}}
{{- end -}}
{{- $merged := list -}}
{{- range $order -}}
{{- $merged = append $merged (get $byName .) -}}
{{- end -}}
{{- toYaml $merged -}}
{{- end -}}
