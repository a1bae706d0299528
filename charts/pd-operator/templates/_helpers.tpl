{{- define "pd-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "pd-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "pd-operator.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "pd-operator.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "pd-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "pd-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "pd-operator.labels" -}}
{{ include "pd-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/component: operator
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{- define "pd-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "pd-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "pd-operator.image" -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end }}

{{- define "pd-operator.simImage" -}}
{{ .Values.simImage.repository }}:{{ default .Chart.AppVersion .Values.simImage.tag }}
{{- end }}

{{- define "pd-operator.webhookService" -}}
{{ include "pd-operator.fullname" . }}-webhook
{{- end }}

{{- /* The PodMonitor's target labels from a PDDeployment pod's labels. */ -}}
{{- define "pd-operator.servingRelabelings" -}}
- {sourceLabels: [__meta_kubernetes_pod_label_pd_inference_dev_deployment], targetLabel: pdd}
- {sourceLabels: [__meta_kubernetes_pod_label_pd_inference_dev_role], targetLabel: role}
- {sourceLabels: [__meta_kubernetes_pod_label_pd_inference_dev_instance], targetLabel: pd_instance}
- {sourceLabels: [__meta_kubernetes_pod_label_pd_inference_dev_kv_set], targetLabel: kv_set}
{{- end }}
