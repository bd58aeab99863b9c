;; A component that exports nothing: no `slinky:builder/plugin@0.1.0`, so no describe().
(component)
