{{/*
kuport.image renders an image reference from a values image block ("image") and the chart's
appVersion ("appVersion"): repository@digest when a digest is set, else repository:tag, the tag
defaulting to appVersion.
*/}}
{{- define "kuport.image" -}}
{{- if .image.digest -}}
{{ .image.repository }}@{{ .image.digest }}
{{- else -}}
{{ .image.repository }}:{{ .image.tag | default .appVersion }}
{{- end -}}
{{- end -}}
